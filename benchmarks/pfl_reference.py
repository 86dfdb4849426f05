"""The cross-device workload in pfl-research's simulator, for benchmarks/cross_device.py.

Runs in a virtual environment of its own (`make bench-venvs`: pfl==0.6.0 with this machine's
torch), never imports fedhet, and reads the very partition fedhet trains on from an .npz written
by the caller: `x` (N x 1 x 28 x 28 float32, already standardized), `y`, `client_offsets`
(client c holds rows offsets[c]:offsets[c+1] of `x`), `test_x`, `test_y`.

FedAvg as fedhet's spec sets it: an MLP 784-200-100-10, 50 clients a round drawn at random, one
local epoch of SGD at lr 0.05 with batch 10, the server applying the mean update with SGD lr 1,
the test set evaluated every 5 rounds. Prints one JSON line: the seconds of the rounds (the
algorithm's run, evaluation included), of the whole process, and the final test accuracy.

    .bench/pfl/bin/python benchmarks/pfl_reference.py DATA.npz --rounds 30 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time

STARTED = time.perf_counter()

import numpy as np  # noqa: E402  (timed from the process's first line)
import torch  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.central_evaluation import CentralEvaluationCallback  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402


class Mlp(torch.nn.Module):
    """784-200-100-10 with ReLUs, and the loss and metrics pfl's PyTorchModel asks for."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(784, 200),
            torch.nn.ReLU(),
            torch.nn.Linear(200, 100),
            torch.nn.ReLU(),
            torch.nn.Linear(100, 10),
        )

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return torch.nn.functional.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=False):
        self.eval() if eval else self.train()
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct = (logits.argmax(1) == y).sum().item()
        return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(correct, len(y))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    np.random.seed(0)

    arrays = np.load(args.data)
    x, y, offsets = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"]), arrays["offsets"]
    clients = [(x[a:b], y[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    sampler = get_user_sampler("random", list(range(len(clients))))
    train = FederatedDataset.from_slices(clients, sampler)
    test = Dataset((torch.from_numpy(arrays["test_x"]), torch.from_numpy(arrays["test_y"])))

    network = Mlp()
    model = PyTorchModel(
        network,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(network.parameters(), lr=1.0),
    )
    evaluation = CentralEvaluationCallback(
        test, model_eval_params=NNEvalHyperParams(local_batch_size=10_000), frequency=5
    )
    params = NNAlgorithmParams(
        central_num_iterations=args.rounds,
        evaluation_frequency=5,
        train_cohort_size=50,
        val_cohort_size=0,
    )
    train_params = NNTrainHyperParams(
        local_learning_rate=0.05, local_num_epochs=1, local_batch_size=10
    )
    backend = SimulatedBackend(training_data=train, val_data=None)
    rounds_started = time.perf_counter()
    FederatedAveraging().run(
        algorithm_params=params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        model_eval_params=NNEvalHyperParams(local_batch_size=10_000),
        callbacks=[evaluation],
    )
    rounds = time.perf_counter() - rounds_started
    accuracy = model.evaluate(test, lambda name: name, NNEvalHyperParams(local_batch_size=10_000))
    accuracy = next(v for k, v in accuracy if "accuracy" in str(k))
    print(
        json.dumps(
            {
                "rounds_s": rounds,
                "process_s": time.perf_counter() - STARTED,
                "accuracy": float(accuracy.overall_value),
            }
        )
    )


if __name__ == "__main__":
    main()
