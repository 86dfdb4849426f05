"""A `--ray` sweep with no shared disk: a local Ray cluster whose two worker nodes run in their own
working folders, with their own HOME and local copies, and share only the loopback S3 server
(one node's keys from the environment, the other's from an AWS profile). The sweep's results
equal a sequential local run's, no worker writes a store into its folders, and a fresh process
elsewhere finds every run stored."""

from __future__ import annotations

import json
import os
from contextlib import chdir
from pathlib import Path

import pytest
from conftest import TINY_SPEC, CliRunner, write_spec
from test_object_store import machine, new_url
from test_object_store_machines import aws_home, written

from benchmarks.s3_server import S3Server

MATRIX = {
    **TINY_SPEC,
    "name": "no-shared-disk",
    "runtime": {"threads": 1, "progress": False},
    "matrix": {"algorithm.name": ["fedavg", "scaffold"]},
}


def folders(root: Path) -> dict[str, Path]:
    made = {name: root / name for name in ("work", "home", "cache")}
    for folder in made.values():
        folder.mkdir(parents=True)
    return made


@pytest.fixture(scope="module")
def nodes(s3: S3Server, tmp_path_factory: pytest.TempPathFactory):
    """(Ray address, each node's folders): two one-CPU nodes, each started in its own working
    folder with its own HOME and cache folder."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    root = tmp_path_factory.mktemp("ray-nodes")
    keyed, profiled = folders(root / "keyed"), folders(root / "profiled")
    aws_home(profiled["home"], s3.endpoint)
    from_keys = {k: v for k, v in s3.variables(keyed["cache"], "").items() if k != "FEDHET_STORE"}
    environments = [
        (keyed, from_keys | {"HOME": str(keyed["home"])}),
        (profiled, {"FEDHET_CACHE": str(profiled["cache"]), "HOME": str(profiled["home"])}
         | {"AWS_PROFILE": "lab"}),
    ]  # fmt: skip
    cluster = cluster_utils.Cluster()
    try:
        for where, env in environments:  # the first is the head
            with chdir(where["work"]):  # a node's workers start in its folder
                cluster.add_node(num_cpus=1, env_vars=env, include_dashboard=False)
        cluster.wait_for_nodes()
        yield cluster.address, [where for where, _ in environments]
    finally:
        cluster.shutdown()


def without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if "time" not in k} for row in rows]


@pytest.mark.slow  # a Ray cluster starts in about 10 s
def test_a_ray_sweep_sharing_only_the_bucket_equals_a_sequential_local_run(
    fedhet: CliRunner, s3: S3Server, nodes, tmp_path: Path
):
    address, workers = nodes
    spec, url = write_spec(tmp_path / "matrix.yaml", MATRIX), new_url()
    driver = folders(tmp_path / "driver")
    env = machine(s3, driver["cache"], url) | {"HOME": str(driver["home"])}
    swept = fedhet("train", spec, "--ray-address", address, "--format", "json", env=env,
                   cwd=driver["work"])  # fmt: skip
    assert swept.rc == 0, swept.stderr
    local = fedhet("train", spec, "--format", "json", store=tmp_path / "local")
    assert local.rc == 0, local.stderr
    assert without_times(json.loads(swept.stdout)) == without_times(json.loads(local.stdout))

    copies = [written(where["cache"]) for where in workers]
    assert any(copies), "no worker node computed anything"
    assert all(".zarr/" in name for names in copies for name in names if "object-stores" in name)
    for where in [*workers, driver]:  # nothing but the local copies, in the cache folders
        assert written(where["work"]) == [], where
        assert [f for f in written(where["home"]) if not f.startswith(".aws/")] == [], where

    elsewhere = folders(tmp_path / "elsewhere")  # another machine: a fresh process, cwd, cache
    plan = fedhet("plan", spec, "--format", "json", env=machine(s3, elsewhere["cache"], url),
                  cwd=elsewhere["work"])  # fmt: skip
    assert plan.rc == 0, plan.stderr
    states = {row["state"] for row in json.loads(plan.stdout)}
    assert states == {"stored"}, plan.stdout
    assert not os.listdir(elsewhere["work"])
