"""SIGINT and SIGTERM become `Interrupted`, so a long stage stops at a safe point with its
checkpoint saved and the process exits 130 or 143 (the shell's convention), never 0."""

from __future__ import annotations

import signal

from fedhet.process import interrupts


def install() -> None:
    signal.signal(signal.SIGINT, interrupts.handle)
    signal.signal(signal.SIGTERM, interrupts.handle)
