"""`finetune`: FedAvg-FT, the standard baseline of personalized federated learning.

FedAvg trains the global model; at evaluation each client fine-tunes it for k local steps on its
own training samples and is scored with the result (e.g. Wang et al. 2019, "Federated Evaluation
of On-device Personalization"; PFLlib and FL-bench report it as FedAvg-FT, with k given in
epochs there). The training is FedAvg's exactly, on any client executor.

Here k is `finetune_steps` steps (a step count is the same work for every client) of the
clients' local SGD (the federation's momentum and weight decay, fresh buffers) at `finetune_lr`
(default `federation.lr`), on batches drawn from the client's own generator
(fedhet.plugin.fine_tune), so k steps are k SGD steps of the global model on the client's data,
and 0 steps leave the global model. Fine-tuning happens at every evaluation: during training
each client's fine-tuned model is scored on its own samples (fedhet.engine.own_evaluation: its
held-out and, with `eval.client_test`, its own test samples; without, the round's test accuracy
is the mean over the clients that have trained of their fine-tuned models' accuracy on the test
set), and in `fedhet eval` every client with samples is fine-tuned, those never sampled
included.
"""

from __future__ import annotations

from fedhet.plugin import FineTuned


class FineTune(FineTuned):
    """FedAvg's training; each client fine-tunes the global model at evaluation."""
