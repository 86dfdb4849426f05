"""The environment is exactly the committed lock (`requirements.lock`, made by pip-tools)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"


def locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)", LOCK.read_text(), flags=re.M)
    return {name.lower().replace("_", "-"): version for name, version in pins}


def test_every_locked_package_has_a_hash():
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text())
    pinned = [b for b in blocks if "==" in b.split("\n", 1)[0]]
    assert pinned and all("--hash=sha256:" in b for b in pinned)


def test_installed_versions_match_the_lock():
    pins = locked()
    assert {"torch", "torchvision", "typer", "pydantic", "zarr"} <= set(pins)
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"
    wrong = {
        name: (version, metadata.version(name))
        for name, version in pins.items()
        if metadata.version(name).split("+")[0] != version
    }
    assert not wrong, f"installed (locked, found): {wrong}"


def test_every_runtime_requirement_is_locked():
    required = metadata.requires("fedhet") or []
    names = {re.split(r"[<>=\[; ]", r, maxsplit=1)[0].lower() for r in required}
    assert names <= set(locked())
