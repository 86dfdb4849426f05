"""`lgfedavg`: Think Locally, Act Globally (Liang et al., 2020), LG-FedAvg.

FedPer's split reversed: each client keeps its own representation (the lower layers) and the
server averages only the top `global_layers` layers. The official code (pliang279/LG-FedAvg,
main_lg.py) takes the last `num_layers_keep` weight layers as global (`global_layers` here,
counted from the output over `fedhet.plugin.parameter_layers`); each sampled client trains its
whole local model, the server averages the global layers and copies them into every client's
model.

Where fedhet differs, and why:
- The official code starts every client from a FedAvg model trained beforehand (`--load_fed`);
  here every client starts from the spec's seeded initial model, as every method does (a warm
  start is a run of its own, not part of the method).
- The official server averages the global layers unweighted over the sampled clients; here they
  are weighted by the clients' sizes, as FedAvg weighs everything in fedhet.
- The official code keeps, per client, the model with the best test accuracy so far and reports
  those; here the clients' models after the last round are evaluated (choosing on test data
  would report a selected maximum).

Only the global layers cross the network; a client that has never trained holds the initial
model's local layers. Evaluation is personalized: each client's local layers under the global
head.
"""

from __future__ import annotations

from fedhet.plugin import PartlyLocal, parameter_layers


class LGFedAvg(PartlyLocal):
    def local_layers(self) -> list[str]:
        return parameter_layers(self.setup.spec.model)[: -self.config.global_layers]
