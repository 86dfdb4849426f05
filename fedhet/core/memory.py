"""Whether a model fits in this machine's memory, checked before anything is allocated: a spec
asking for more is refused with the size it would need instead of failing deep in a run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedhet.core.architectures import describe
from fedhet.core.errors import InputError
from fedhet.core.spec import Spec, expand

# Training holds several fp32 copies of the parameters: the weights, their gradients, optimizer
# or algorithm state (momentum, control variates) and the global model beside a client's.
COPIES = 4
FP32_BYTES = 4
MEMINFO = Path("/proc/meminfo")


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo; None where the system does not say (not Linux)."""
    try:
        lines = MEMINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            return int(value.split()[0]) * 1024  # kB
    return None


def require_fits(parameters: int, what: str, fix: str) -> None:
    """InputError naming `what` and the memory it would need, unless `parameters` fit."""
    need = parameters * FP32_BYTES * COPIES
    available = available_bytes()
    if available is None or need <= available:
        return
    raise InputError(
        f"{what}: {parameters:,} parameters need about {_gib(need)} to train ({COPIES}x their "
        f"fp32 size), more than the {_gib(available)} this machine has available; {fix}"
    )


def require_models_fit(
    spec: Spec, where: Path, shapes: Mapping[str, tuple[tuple[int, int, int], int]]
) -> None:
    """Refuse a spec any of whose runs' models would not fit, counted from the model's
    description and its dataset's (image shape, classes) in `shapes`."""
    for _, run in expand(spec):
        image, classes = shapes[run.data.dataset]
        model = describe(run.model, image, classes)
        require_fits(model.parameter_count, f"{where}: model ({run.model.arch})", model.shrink)


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"
