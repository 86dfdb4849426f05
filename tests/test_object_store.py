"""The artifact store on S3-compatible object storage, against a real S3 server on loopback
(`rclone serve s3`, from the locked development dependencies): results equal the local store's,
another machine (another local copy) reuses them, a server lost mid-train loses nothing, a
half-written artifact is never read, and the secret key is written nowhere."""

from __future__ import annotations

import csv
import io
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import TINY_SPEC, CliRunner, cli_env, write_spec

from benchmarks.s3_server import BUCKET, KEY_ID, SECRET, S3Server, free_port

SPEC = {
    **TINY_SPEC,
    "name": "tiny-quickstart",
    "matrix": {"algorithm": [{"name": "fedavg"}, {"name": "fedprox", "mu": 0.01}]},
}


def machine(s3: S3Server, cache: Path, url: str) -> dict[str, str]:
    """The environment of a machine with its own local copies (`cache`) of the store `url`."""
    return cli_env(**s3.variables(cache, url))


def new_url() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"


def metrics(export_csv: str) -> list[dict[str, str]]:
    """The rows of `fedhet export`, less the wall times."""
    rows = list(csv.DictReader(io.StringIO(export_csv)))
    assert rows
    return [{k: v for k, v in row.items() if "time" not in k} for row in rows]


def one_line_error(result, rc: int) -> str:
    assert result.rc == rc, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- a store URL, never a folder --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("gs://bucket/x", "unsupported scheme"),
        (f"s3://{KEY_ID}:{SECRET}@bucket/x", "credentials do not go in the URL"),
        ("s3://bucket/x", "unreachable; check AWS_ENDPOINT_URL"),
        ("s3://bucket/x", "no credentials; set AWS_ACCESS_KEY_ID"),
    ],
    ids=["other-scheme", "credentials-in-url", "unreachable", "no-credentials"],
)
def test_a_store_url_is_never_taken_for_a_folder(
    fedhet: CliRunner, tmp_path: Path, url: str, said: str
):
    spec, work = write_spec(tmp_path / "spec.yaml", SPEC), tmp_path / "work"
    work.mkdir()
    closed = f"http://127.0.0.1:{free_port()}"
    env = cli_env(FEDHET_STORE=url, FEDHET_CACHE=str(tmp_path / "cache"), AWS_ENDPOINT_URL=closed)
    env = {k: v for k, v in env.items() if not k.startswith("AWS_") or k == "AWS_ENDPOINT_URL"}
    if "credentials" not in said:
        env |= {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}
    result = fedhet("train", spec, env=env, cwd=work)
    assert said in one_line_error(result, 2)
    assert SECRET not in result.stderr + result.stdout
    assert list(work.iterdir()) == []  # no folder `s3:` or `gs:`, nothing computed


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"AWS_SECRET_ACCESS_KEY": "not-the-secret-0000000"}, "wrong credentials"),
        ({"FEDHET_STORE": "s3://no-such-bucket/x"}, "no such bucket"),
    ],
    ids=["wrong-secret", "missing-bucket"],
)
def test_a_store_that_cannot_be_used_fails_in_one_line_before_computing(
    fedhet: CliRunner, s3: S3Server, tmp_path: Path, change: dict, said: str
):
    spec = write_spec(tmp_path / "spec.yaml", SPEC)
    env = machine(s3, tmp_path / "cache", new_url()) | change
    result = fedhet("train", spec, env=env)
    assert said in one_line_error(result, 2)
    assert "computing" not in result.stdout + result.stderr


# --- results on the object store --------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(fedhet: CliRunner, s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny quickstart trained on a local store and on the S3 store (machine A)."""
    root = tmp_path_factory.mktemp("trained")
    spec, url = write_spec(root / "spec.yaml", SPEC), new_url()
    local = fedhet("train", spec, store=root / "local")
    remote = fedhet("train", spec, env=machine(s3, root / "machine-a", url))
    assert local.rc == 0 and remote.rc == 0, local.stderr + remote.stderr
    return {"root": root, "spec": spec, "url": url, "outputs": [local, remote]}


def test_the_quickstart_on_s3_equals_the_local_store_and_another_machine_reuses_it(
    fedhet: CliRunner, s3: S3Server, trained: dict
):
    root, spec, url = trained["root"], trained["spec"], trained["url"]
    local = fedhet("export", spec, store=root / "local")
    machine_b = machine(s3, root / "machine-b", url)  # an empty local copy: all from the server
    again = fedhet("train", spec, env=machine_b)
    assert again.rc == 0, again.stderr
    assert "computing" not in again.stderr and again.stderr.count("reusing") == 4
    exported = fedhet("export", spec, env=machine_b)
    assert exported.rc == 0 and local.rc == 0, exported.stderr + local.stderr
    assert metrics(exported.stdout) == metrics(local.stdout)

    runs = fedhet("runs", spec, env=machine_b)
    assert runs.rc == 0 and runs.stdout.count("stored") == 2, runs.stdout + runs.stderr
    report = fedhet("report", spec, "--out", root / "report", env=machine_b)
    assert report.rc == 0, report.stderr
    assert any((root / "report").glob("*.md"))
    verify = fedhet("artifacts", "verify", env=machine_b)
    assert verify.rc == 0, verify.stderr
    assert verify.stdout.count(": ok") == 3, verify.stdout
    trained["outputs"] += [again, exported, runs, report, verify]


def files(folder: Path) -> dict[str, bytes]:
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in folder.rglob("*.zarr/**/*")
            if f.is_file()}  # fmt: skip


def copied(result) -> int:
    return sum(line.startswith("copied ") for line in result.stdout.splitlines())


def test_push_then_pull_round_trips_every_artifact_bit_for_bit_and_resumes(
    fedhet: CliRunner, s3: S3Server, trained: dict, tmp_path: Path
):
    local, url = trained["root"] / "local", new_url()
    env = machine(s3, tmp_path / "machine-c", url)
    (first, *rest) = sorted(files(local))
    partly = tmp_path / "partly"  # a pull interrupted after its first artifact
    artifact = first.split(".zarr")[0] + ".zarr"
    (partly / artifact).parent.mkdir(parents=True)
    shutil.copytree(local / artifact, partly / artifact)

    pushed = fedhet("artifacts", "push", url, "--store", local, env=env)
    assert pushed.rc == 0 and copied(pushed) == 3, pushed.stdout + pushed.stderr
    pulled = fedhet("artifacts", "pull", url, "--store", partly, env=env)
    assert pulled.rc == 0 and copied(pulled) == 2, pulled.stdout + pulled.stderr
    assert files(partly) == files(local)
    again = fedhet("artifacts", "push", url, "--store", local, env=env)
    assert again.rc == 0 and "0 copied to " + url in again.stdout, again.stdout
    trained["outputs"] += [pushed, pulled, again]


def test_no_secret_is_written_anywhere_and_the_url_shown_has_no_credentials(
    fedhet: CliRunner, s3: S3Server, trained: dict
):
    root = trained["root"]
    for result in trained["outputs"]:
        assert SECRET not in result.stdout + result.stderr
        assert KEY_ID not in result.stdout + result.stderr
    written = [f for where in (s3.root, root) for f in where.rglob("*") if f.is_file()]
    assert len(written) > 50  # the artifacts on the server, the local copies, the report
    assert [f for f in written if SECRET.encode() in f.read_bytes()] == []


def test_an_artifact_without_its_marker_is_absent_and_one_not_matching_it_is_never_read(
    fedhet: CliRunner, s3: S3Server, trained: dict, tmp_path: Path, monkeypatch
):
    import obstore

    from fedhet.core.object_store import remote_for

    for name, value in s3.variables(tmp_path, "").items():
        monkeypatch.setenv(name, value)
    source, copy_url = remote_for(trained["url"]), new_url()
    copy = remote_for(copy_url)
    assert source is not None and copy is not None
    names = [o["path"] for batch in obstore.list(source.store) for o in batch]
    markers = [name for name in names if name.endswith(".commit")]
    for name in names:
        if name not in markers:  # a writer that died before its markers
            obstore.put(copy.store, name, obstore.get(source.store, name).bytes())
    runs = fedhet("runs", trained["spec"], env=machine(s3, tmp_path / "b", copy_url))
    assert runs.rc == 0 and runs.stdout.count("missing") == 2, runs.stdout + runs.stderr

    for marker in markers:
        obstore.put(copy.store, marker, obstore.get(source.store, marker).bytes())
    (chunk,) = [n for n in names if n.startswith("partition/") and n.endswith("/c/0")][:1]
    obstore.put(copy.store, chunk, b"not what the marker says")
    result = fedhet("train", trained["spec"], env=machine(s3, tmp_path / "c", copy_url))
    line = one_line_error(result, 1)
    assert "damaged (checksum mismatch)" in line and "partition/" in line, line


# --- the server lost mid-train ----------------------------------------------------------------

ROUNDS = 12
SLOW = {
    **TINY_SPEC,
    "name": "interruptible",
    "model": {"arch": "mlp", "hidden": [32]},
    "federation": {"rounds": ROUNDS, "batch_size": 16, "lr": 0.05},
    "runtime": {"threads": 1, "checkpoint_every": 1, "progress": False},
}


def test_the_server_killed_mid_train_then_a_rerun_equals_an_uninterrupted_run(
    fedhet: CliRunner, s3: S3Server, tmp_path: Path
):
    spec, url, cache = write_spec(tmp_path / "spec.yaml", SLOW), new_url(), tmp_path / "cache"
    env = machine(s3, cache, url)
    copy = cache / "object-stores" / BUCKET / url.rsplit("/", 1)[1]
    with ThreadPoolExecutor(1) as background:  # the forked `fedhet` saves a start-up
        training = background.submit(fedhet, "train", spec, env=env)
        deadline = time.monotonic() + 120
        try:
            while not list(copy.glob("train/*.partial/ckpt-*.zarr")):
                assert not training.done(), "fedhet train ended before its first checkpoint"
                assert time.monotonic() < deadline, "no checkpoint appeared"
                time.sleep(0.02)
        finally:
            s3.stop()
        try:
            killed = training.result(timeout=120)
        finally:
            s3.start()
    assert killed.rc == 1 and "Traceback" not in killed.stderr, killed.stderr
    assert f"store {url}: unreachable" in killed.stderr.strip().splitlines()[-1], killed.stderr
    assert not list(copy.glob("train/*.zarr"))  # nothing published here either

    resumed = fedhet("train", spec, env=env)
    assert resumed.rc == 0, resumed.stderr
    assert "resuming train" in resumed.stderr, resumed.stderr
    # the reference writes no checkpoint: a runtime setting, the same key
    local = fedhet("train", spec, "runtime.checkpoint_every=1000", store=tmp_path / "local")
    assert local.rc == 0, local.stderr
    exports = [fedhet("export", spec, env=env), fedhet("export", spec, store=tmp_path / "local")]
    assert all(e.rc == 0 for e in exports), [e.stderr for e in exports]
    assert metrics(exports[0].stdout) == metrics(exports[1].stdout)
