"""The environment an artifact was computed in: recorded in its attributes, never in a key.

Results are bitwise reproducible only within one environment (thread count, torch build, CPU
vector instructions, device), so reusing an artifact computed elsewhere is announced. torch is
imported inside the functions: `spec validate` must not pay for it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet import __version__
from fedhet.core.cache import cached_json
from fedhet.process import cores

if TYPE_CHECKING:
    from fedhet.core.spec import RuntimeSpec

# The fields that can change results; the others (platform, python, fedhet's revision) are
# recorded for the reader. Compared only where both sides name one: `clients` (the train stage's
# client executor, recorded by the stage; `runtime.clients: auto` accepts either) and `cpu`
# (artifacts stored before it was recorded) and `threads` (a spec without `runtime.threads`
# computes on the cores free at the time, fedhet.process.cores, so it plans no count).
COMPARED = ("threads", "torch", "torch_cuda", "torch_git", "cpu", "device", "clients")
OPTIONAL = ("cpu", "clients", "threads")


@functools.cache
def git_revision(checkout: Path = Path(__file__).resolve().parents[2]) -> dict[str, Any] | None:
    """HEAD and whether tracked files outside `reports/` differ from it, when fedhet runs from
    a git checkout. `reports/` holds what `make reproduce` writes, not what computes a result:
    a run started while a report waits to be committed is still computed from the commit."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(checkout), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != checkout:
            return None  # installed inside some other repository
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!reports"))
        return {"revision": git("rev-parse", "HEAD"), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):  # no git, not a checkout, git refused
        return None


def _device(device: str) -> dict[str, str]:
    if device != "cuda":
        return {"device": device}
    import torch

    return {"device": "cuda", "gpu": torch.cuda.get_device_name()}


@functools.cache
def torch_build() -> dict[str, Any]:
    """torch's version, CUDA build and git revision, and the vector instruction set its CPU
    kernels use on this machine (`cpu`: DEFAULT, AVX2, AVX512, ...; kernels for another one sum
    in another order). Knowing them takes importing torch (seconds), so they are kept in the
    cache per installed torch and CPU: a command that only reuses stored artifacts compares
    without importing it."""
    if "torch" in sys.modules:
        return _torch_build()
    return cached_json("torch_build", _installed_torch_and_cpu(), _torch_build)


def _installed_torch_and_cpu() -> str:
    """What the torch build facts depend on: the installed torch files and this CPU's flags."""
    location = importlib.util.find_spec("torch").origin
    flags = ""
    if Path("/proc/cpuinfo").is_file():
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next((line for line in lines if line.startswith(("flags", "Features"))), "")
    stamp = os.stat(location).st_mtime_ns
    environment = os.environ.get("ATEN_CPU_CAPABILITY", "")
    return f"{location}|{stamp}|{platform.machine()}|{flags}|{environment}"


def _torch_build() -> dict[str, Any]:
    import torch

    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_git": torch.version.git_version,
        "cpu": torch.backends.cpu.get_cpu_capability(),
    }


def environment(threads: int | None = None, device: str | None = None) -> dict[str, Any]:
    """This process's environment. By default the thread count and device are the ones in use
    now (CUDA counts as in use once it is initialized); a caller that is about to compute with
    other settings passes them."""
    import torch

    threads = threads or torch.get_num_threads()
    if device is None:
        device = "cuda" if torch.cuda.is_initialized() else "cpu"
    return _recorded(threads, device)


def _recorded(threads: int | None, device: str) -> dict[str, Any]:
    """The environment with these settings (no thread count for None); imports no torch
    unless the device is CUDA."""
    env: dict[str, Any] = {"fedhet": __version__}
    revision = git_revision()
    if revision is not None:
        env["git"] = revision
    return {
        **env,
        **torch_build(),
        **({"threads": threads} if threads else {}),
        **_device(device),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def use_threads(threads: int | None) -> None:
    """Compute with `runtime.threads` when the spec sets it, else on the free cores
    (fedhet.process.cores; OMP_NUM_THREADS, set by a user or Ray, is left to torch): called
    before every stage computes, whichever command or worker runs it, so the environment
    recorded with the artifact is the one it was computed in."""
    if not threads and "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    torch.set_num_threads(threads or cores.default_threads())


def planned_environment(threads: int | None, device: str, clients: str = "auto") -> dict[str, Any]:
    """The environment a stage would be computed in now, given the spec's runtime settings
    (`device` auto means CUDA when available; `clients` auto names no executor, no `threads`
    no thread count)."""
    if device == "auto":
        device = "cuda" if _cuda_available() else "cpu"
    return _recorded(threads, device) | ({} if clients == "auto" else {"clients": clients})


# Present wherever an NVIDIA driver is loaded (Linux, containers, WSL's /dev/dxg)
_GPU_DRIVER_FILES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


def _cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch where the answer is plainly no (a
    CPU-only torch build, or no NVIDIA driver loaded): reusing stored artifacts stays fast."""
    if torch_build()["torch_cuda"] is None or not any(map(os.path.exists, _GPU_DRIVER_FILES)):
        return False
    import torch

    return torch.cuda.is_available()


def differences(stored: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What differs between a stored environment and `current`, in words ("2 threads, now 1");
    an artifact that recorded no environment differs in nothing known."""
    if not stored:
        return []
    return [
        f"{_describe(stored, name)} (now {_describe(current, name)})"
        for name in COMPARED
        if stored.get(name) != current.get(name)
        and (name not in OPTIONAL or (name in stored and name in current))
    ]


def changes(stored: dict[str, Any] | None, runtime: RuntimeSpec) -> list[str]:
    """What differs between a stored environment and the one `runtime` would compute in now,
    the earlier rounds of a run resumed in another environment included."""
    now = planned_environment(runtime.threads, runtime.device, runtime.clients)
    return differences(stored, now) + [
        f"rounds {first}-{last}: {', '.join(differences(env, now))}"
        for (first, last), env in _earlier(stored)
        if differences(env, now)  # an unrecorded one differs in nothing known
    ]


# Where a run's rounds ran: while it runs, segments {"from_round", "environment"} oldest first,
# in its checkpoints and continuation, a new one where it resumes in another environment; once
# stored, `environment["earlier"]`, the list of every segment but the last as {"rounds":
# [first, last], "environment"}, absent for a run computed in one environment. The environment
# is None where a checkpoint predates this record.


def segments_after(segments: list[dict], done: int, here: dict[str, Any]) -> list[dict]:
    """The environments a run's rounds ran in, once it goes on in `here` after `done` rounds
    computed in `segments`."""
    if done == 0:
        return [{"from_round": 1, "environment": here}]
    # a checkpoint of the round before a continuation's first holds that first round's segment
    segments = [s for s in segments if s["from_round"] <= done]
    segments = segments or [{"from_round": 1, "environment": None}]
    last = segments[-1]["environment"]
    if last is None or differences(last, here):
        return [*segments, {"from_round": done + 1, "environment": here}]
    return segments


def segments_of(stored: dict[str, Any] | None) -> list[dict]:
    """The segments of a stored run, from its `environment`: its earlier ones, then its own."""
    if not stored:
        return [{"from_round": 1, "environment": None}]
    spans = _earlier(stored)
    earlier = [{"from_round": first, "environment": env} for (first, _), env in spans]
    own = {name: value for name, value in stored.items() if name != "earlier"}
    start = spans[-1][0][1] + 1 if spans else 1
    return [*earlier, {"from_round": start, "environment": own}]


def earlier_of(segments: list[dict]) -> dict[str, Any]:
    """What a finished run adds to its environment: `earlier`, when its rounds ran in more than
    one."""
    ends = [segment["from_round"] - 1 for segment in segments[1:]]
    earlier = [
        {"rounds": [segment["from_round"], end], "environment": segment["environment"]}
        for segment, end in zip(segments, ends, strict=False)
    ]
    return {"earlier": earlier} if earlier else {}


def _earlier(stored: dict[str, Any] | None) -> list[tuple[tuple[int, int], dict | None]]:
    return [
        ((segment["rounds"][0], segment["rounds"][1]), segment["environment"])
        for segment in (stored or {}).get("earlier", [])
    ]


def reuse_note(stored: dict[str, Any] | None, runtime: RuntimeSpec) -> str:
    """'' when a stored artifact was computed the way `runtime` would compute it now; otherwise
    what differs, to append to the line that announces the reuse."""
    changed = changes(stored, runtime)
    return f", computed under another environment: {', '.join(changed)}" if changed else ""


def _describe(env: dict[str, Any], name: str) -> str:
    value = env.get(name)
    return {
        "threads": f"{value} thread{'s' if value != 1 else ''}",
        "torch": f"torch {value}",
        "torch_cuda": f"CUDA build {value}" if value else "CPU-only torch build",
        "torch_git": f"torch git {str(value)[:12]}",
        "cpu": f"CPU capability {value}",
        "device": f"device {_device_text(env)}",
        "clients": f"{value} clients",
    }[name]


def _device_text(env: dict[str, Any]) -> str:
    return f"{env['device']} ({env['gpu']})" if env.get("gpu") else str(env.get("device"))


def described(env: dict[str, Any]) -> dict[str, str]:
    """The environment as (field, readable value) pairs, for `artifacts show` and reports."""
    git = env.get("git")
    revision = "not a git checkout"
    if git:
        revision = git["revision"][:12] + (" (uncommitted changes)" if git["dirty"] else "")
    earlier = _earlier_text(env) if env.get("earlier") else ""
    return {
        "fedhet": f"{env.get('fedhet')}, {revision}",
        "torch": f"{env.get('torch')}, {_describe(env, 'torch_cuda')}, git "
        f"{str(env.get('torch_git'))[:12]}",
        **({"cpu": str(env["cpu"])} if "cpu" in env else {}),
        "threads": str(env.get("threads")),
        "device": _device_text(env),
        **({"clients": str(env["clients"])} if "clients" in env else {}),
        "platform": f"{env.get('platform')} ({env.get('machine')})",
        "python": str(env.get("python")),
        **({"earlier": earlier} if earlier else {}),
    }


def _earlier_text(env: dict[str, Any]) -> str:
    """The earlier rounds of a run resumed in another environment, each with what differed
    ("rounds 1-120 under torch 2.11.0+cu130, ...")."""
    final = described({name: value for name, value in env.items() if name != "earlier"})
    parts = []
    for (first, last), earlier in _earlier(env):
        if earlier is None:
            parts.append(f"rounds {first}-{last} in an environment not recorded")
            continue
        shown = described(earlier)
        differ = [f"{name} {value}" for name, value in shown.items() if final.get(name) != value]
        if differ:  # not where the run went back to its last environment
            parts.append(f"rounds {first}-{last} under {', '.join(differ)}")
    return "; ".join(parts)


def summary(env: dict[str, Any] | None) -> str:
    """One line naming the environment."""
    if not env:
        return "not recorded (computed before fedhet recorded environments)"
    return "; ".join(f"{name} {value}" for name, value in described(env).items())
