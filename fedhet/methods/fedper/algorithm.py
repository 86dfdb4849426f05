"""`fedper`: Federated Learning with Personalization Layers (Arivazhagan et al., 2019).

The paper splits the network into base layers, trained by every client and averaged by the
server as FedAvg does, and personalization layers (the last ones), trained by each client with
its base and never sent (Algorithm 1: the client updates base and personal layers together by
SGD; the server averages the base layers weighted by the clients' sizes). The paper has no
official code; PFLlib (TsingZ0/PFLlib, FedPer) does the same with the model's head as the
personal part. Here `personal_layers` counts the personal layers from the output over the
model's layers that hold parameters (`fedhet.plugin.parameter_layers`: the head is 1, as in
PFLlib; the paper uses 1 or 2 for its ResNets and MobileNets).

- A client that has never trained holds the initial model's personal layers (every client starts
  from the same seeded model, so nothing is sent for them).
- A client trains its whole model with the federation's local SGD from the round's base and its
  own personal layers; only its base layers cross the network (bytes up and down count them).
- Evaluation is personalized: each client's model is the global base with its own personal
  layers. With `personal_layers: 0` every layer is federated: FedAvg, bit for bit.
"""

from __future__ import annotations

from fedhet.plugin import PartlyLocal, parameter_layers


class FedPer(PartlyLocal):
    def local_layers(self) -> list[str]:
        count = self.config.personal_layers
        return parameter_layers(self.setup.spec.model)[-count:] if count else []
