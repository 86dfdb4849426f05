"""Whether a model fits in this machine's memory, checked before anything is allocated: a spec
asking for more is refused (by the caller) with the size it would need instead of failing deep
in a run."""

from __future__ import annotations

from pathlib import Path

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


def shortage(parameters: int, what: str, fix: str) -> str | None:
    """One line naming `what` and the memory it would need when `parameters` do not fit, else
    None."""
    need = parameters * FP32_BYTES * COPIES
    available = available_bytes()
    if available is None or need <= available:
        return None
    return (
        f"{what}: {parameters:,} parameters need about {_gib(need)} to train ({COPIES}x their "
        f"fp32 size), more than the {_gib(available)} this machine has available; {fix}"
    )


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"
