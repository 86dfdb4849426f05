"""LEAF's JSON folders (`data: {dataset: leaf, ...}`, fedhet.data.leaf): one client per user, each
scored on its own test samples, the folder's bytes in the key, text tasks training the
char-LSTM, and methods that alter inputs refusing text. Every folder is built here, tiny."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import CliRunner, write_spec

from fedhet.core.errors import InputError
from fedhet.core.spec import parse_spec
from fedhet.data.datasets import load_data
from fedhet.data.leaf import VOCABULARY
from fedhet.data.partition_plan import partition_node
from fedhet.data.partition_stage import spec_partition

USERS = {"f_0002": (5, 2), "f_0001": (7, 3), "f_0003": (4, 1)}  # user -> (train, test) samples


def leaf_folder(root: Path, task: str, users: dict[str, tuple[int, int]] = USERS) -> Path:
    """train/ and test/ JSON files as LEAF's preprocessing writes them, for `task`; the training
    users split over two files."""
    rng = np.random.default_rng(0)

    def sample() -> tuple[object, object]:
        if task == "femnist":
            return rng.random(784).round(3).tolist(), int(rng.integers(62))
        if task == "shakespeare":
            chars = rng.choice(list(VOCABULARY), 81)
            return "".join(chars[:80]), str(chars[80])
        return ["1", "date", "NO_QUERY", "u", "so happy today!"], int(rng.integers(2))

    for i, split in enumerate(("train", "test")):
        files: list[dict[str, dict]] = [{}, {}] if split == "train" else [{}]
        for n, (user, sizes) in enumerate(users.items()):
            drawn = [sample() for _ in range(sizes[i])]
            files[n % len(files)][user] = {"x": [x for x, _ in drawn], "y": [y for _, y in drawn]}
        (root / split).mkdir(parents=True)
        for k, data in enumerate(files):
            counts = [len(d["y"]) for d in data.values()]
            document = {"users": list(data), "num_samples": counts, "user_data": data}
            (root / split / f"part_{k}.json").write_text(json.dumps(document))
    return root


def spec_of(path: Path, task: str = "femnist", **data: object) -> dict:
    model = {"femnist": {"arch": "mlp", "hidden": [16]}, "shakespeare": {"arch": "char_lstm"}}
    return {
        "data": {"dataset": "leaf", "path": str(path), "task": task, **data},
        "partition": {"scheme": "natural"},
        "model": model.get(task, {"arch": "bag_of_words", "embedding": 8}),
        "federation": {"rounds": 2, "clients_per_round": 2, "batch_size": 4, "lr": 0.05},
        "eval": {"client_test": {}},
    }


def test_users_are_the_clients_and_their_test_samples_their_own_test_sets(tmp_path: Path):
    spec = parse_spec(spec_of(leaf_folder(tmp_path / "femnist", "femnist")))
    assert spec.partition.clients == 3
    data, part = load_data(spec.data, seed=0), spec_partition(spec)
    assert data.shape == (1, 28, 28) and data.num_classes == 62
    assert [len(k) for k in part.client_indices] == [7, 5, 4]  # f_0001, f_0002, f_0003
    assert np.bincount(data.test_client).tolist() == [3, 2, 1]
    users = json.loads((tmp_path / "femnist" / "train" / "part_0.json").read_text())["user_data"]
    first = np.asarray(users["f_0002"]["x"][0], np.float32).reshape(1, 28, 28)
    assert np.array_equal(data.train_x[part.client_indices[1][0]].numpy(), first)


def test_sampling_keeps_users_with_enough_samples_and_a_fixed_share(tmp_path: Path):
    root = leaf_folder(tmp_path / "femnist", "femnist")
    assert parse_spec(spec_of(root, min_samples=6)).partition.clients == 2  # f_0003: 5 samples
    sampled = parse_spec(spec_of(root, user_fraction=0.5))
    assert sampled.partition.clients == 2  # round(0.5 * 3)
    assert parse_spec(spec_of(root, user_fraction=0.5)).data.users() == sampled.data.users()
    with pytest.raises(InputError, match="data.path: no training user kept"):
        parse_spec(spec_of(root, min_samples=100))


def test_text_tasks_encode_characters_and_hashed_words(tmp_path: Path):
    shakespeare = parse_spec(spec_of(leaf_folder(tmp_path / "s", "shakespeare"), "shakespeare"))
    data = load_data(shakespeare.data, seed=0)
    assert data.shape == (1, 1, 80) and data.num_classes == 80
    assert data.train_x.min() >= 0 and data.train_x.max() < 80
    assert data.train_x.eq(data.train_x.round()).all()
    sent140 = parse_spec(spec_of(leaf_folder(tmp_path / "t", "sent140"), "sent140"))
    sent = load_data(sent140.data, seed=0)
    words = sent.train_x.reshape(len(sent.train_x), -1)[0]
    assert words[:4].gt(0).all() and words[4:].eq(0).all()  # so, happy, today, ! and padding
    assert len(set(words[:4].tolist())) == 4


def test_the_key_changes_exactly_when_a_byte_of_the_folder_changes(tmp_path: Path):
    root = leaf_folder(tmp_path / "femnist", "femnist")
    key = partition_node(parse_spec(spec_of(root))).key
    moved = root.rename(tmp_path / "moved")
    assert partition_node(parse_spec(spec_of(moved))).key == key
    file = moved / "test" / "part_0.json"
    content = file.read_text()
    file.write_text(content.replace("0.", "0.9", 1))
    changed = partition_node(parse_spec(spec_of(moved))).key
    assert changed != key
    file.write_text(content)
    assert partition_node(parse_spec(spec_of(moved))).key == key
    assert partition_node(parse_spec(spec_of(moved, min_samples=1))).key != key


def test_fedavg_and_fedprox_train_on_a_femnist_folder(fedhet: CliRunner, tmp_path: Path):
    spec = spec_of(leaf_folder(tmp_path / "femnist", "femnist"))
    spec["matrix"] = {"algorithm": [{"name": "fedavg"}, {"name": "fedprox", "mu": 0.1}]}
    path = write_spec(tmp_path / "femnist.yaml", spec)
    store = tmp_path / "store"
    trained = fedhet("train", path, store=store)
    assert trained.rc == 0, trained.stderr
    assert trained.stderr.count("round 2/2") == 2 and "FedProx" in trained.stdout
    scored = fedhet("eval", path, store=store)
    assert scored.rc == 0, scored.stderr
    assert scored.stdout.count("own test sets: client mean") == 2


def test_the_char_lstm_trains_on_a_shakespeare_folder(fedhet: CliRunner, tmp_path: Path):
    """FedAvg, and TCT, whose eNTK hooks every parameterized module (the LSTM returns one
    tensor for it)."""
    spec = spec_of(leaf_folder(tmp_path / "s", "shakespeare"), "shakespeare")
    spec["model"] |= {"hidden": 16}
    tct = {"name": "tct", "stage1": {"rounds": 1}, "stage2": {"rounds": 1}}
    spec["matrix"] = {"algorithm": [{"name": "fedavg"}, tct]}
    result = fedhet("train", write_spec(tmp_path / "s.yaml", spec), store=tmp_path / "store")
    assert result.rc == 0, result.stderr
    assert "FedAvg, natural, seed 0: round 2/2" in result.stderr and "TCT" in result.stdout


@pytest.mark.parametrize(
    "model",
    [
        {"arch": "char_lstm"},
        {"arch": "char_lstm", "layers": 3, "hidden": 7},
        {"arch": "bag_of_words", "buckets": 50, "embedding": 3},
    ],
)
def test_text_models_count_their_parameters_as_built(model: dict):
    from fedhet.core.spec import model_configs
    from fedhet.models import build_model, num_parameters

    config = model_configs()[model["arch"]].model_validate(model)
    built = build_model(config, (1, 1, 80), 80, seed=0)
    assert config.parameter_count((1, 1, 80), 80) == num_parameters(built)


@pytest.mark.parametrize(
    ("algorithm", "field", "why"),
    [
        ({"name": "mixup"}, "algorithm.name", "mixup mixes two samples' inputs"),
        ({"name": "fedmix"}, "algorithm.name", "fedmix mixes two samples' inputs"),
        ({"name": "fedbr"}, "algorithm.name", "fedbr trains on pseudo-data"),
        ({"name": "fedavg", "vhl": {}}, "algorithm.vhl", "fedavg+VHL trains on virtual images"),
    ],
)
def test_methods_that_alter_inputs_refuse_text(
    fedhet: CliRunner, tmp_path: Path, algorithm: dict, field: str, why: str
):
    spec = spec_of(leaf_folder(tmp_path / "s", "shakespeare"), "shakespeare") | {
        "algorithm": algorithm
    }
    result = fedhet("spec", "validate", write_spec(tmp_path / "s.yaml", spec))
    assert result.rc == 2 and "Traceback" not in result.stderr
    assert f"{field}: {why}" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_images_of_femnist_still_take_mixup(tmp_path: Path):
    spec = spec_of(leaf_folder(tmp_path / "f", "femnist")) | {"algorithm": {"name": "mixup"}}
    assert parse_spec(spec).algorithm.name == "mixup"


def _drop_num_samples(root: Path) -> str:
    file = root / "train" / "part_0.json"
    document = json.loads(file.read_text())
    document["num_samples"][0] += 1
    file.write_text(json.dumps(document))
    return "train/part_0.json: user 'f_0002' has 5 samples, num_samples says 6"


def _not_json(root: Path) -> str:
    (root / "test" / "part_0.json").write_text("{users: [")
    return "test/part_0.json: not valid JSON"


def _no_user_data(root: Path) -> str:
    (root / "train" / "part_1.json").write_text(json.dumps({"users": []}))
    return "train/part_1.json: no user_data object"


def _a_user_twice(root: Path) -> str:
    second = root / "train" / "part_2.json"
    second.write_text((root / "train" / "part_1.json").read_text())
    return "train/part_2.json: user 'f_0001' again"


def _no_test_folder(root: Path) -> str:
    for file in (root / "test").iterdir():
        file.unlink()
    return "no test/*.json files"


def _short_image(root: Path) -> str:
    file = root / "test" / "part_0.json"
    document = json.loads(file.read_text())
    document["user_data"]["f_0003"]["x"][0] = [0.5] * 10
    file.write_text(json.dumps(document))
    return "test: user 'f_0003': x is not a list of 784 pixel values"


@pytest.mark.parametrize(
    "damage", [_drop_num_samples, _not_json, _no_user_data, _a_user_twice, _no_test_folder]
)
def test_a_malformed_folder_is_refused_in_one_line_naming_the_file(
    fedhet: CliRunner, tmp_path: Path, damage
):
    root = leaf_folder(tmp_path / "femnist", "femnist")
    expected = damage(root)
    result = fedhet("spec", "validate", write_spec(tmp_path / "f.yaml", spec_of(root)))
    assert result.rc == 2 and "Traceback" not in result.stderr
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_malformed_samples_are_refused_when_loaded_naming_the_user(
    fedhet: CliRunner, tmp_path: Path
):
    root = leaf_folder(tmp_path / "femnist", "femnist")
    expected = _short_image(root)
    path = write_spec(tmp_path / "f.yaml", spec_of(root))
    result = fedhet("train", path, store=tmp_path / "store")
    assert result.rc == 2 and "Traceback" not in result.stderr
    assert expected in result.stderr


def test_a_missing_folder_says_where_to_get_it(fedhet: CliRunner, tmp_path: Path):
    path = write_spec(tmp_path / "f.yaml", spec_of(tmp_path / "absent"))
    result = fedhet("spec", "validate", path)
    assert result.rc == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "folder not found" in result.stderr and "docs/how-to/leaf.md" in result.stderr


def test_own_test_sets_need_data_naming_its_test_clients(tmp_path: Path):
    with pytest.raises(InputError, match="names no clients; give per_client"):
        parse_spec({"data": {"dataset": "digits"}, "eval": {"client_test": {}}})
    spec = spec_of(leaf_folder(tmp_path / "f", "femnist"))
    spec["partition"] = {"scheme": "iid", "clients": 2}
    with pytest.raises(InputError, match="set partition.scheme: natural or give per_client"):
        parse_spec(spec)


SPECS = sorted((Path(__file__).parents[1] / "specs" / "leaf").glob("*.yaml"))


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_fedprox_specs_say_where_to_get_the_data_and_plan_once_it_is_there(
    fedhet: CliRunner, tmp_path: Path, path: Path
):
    absent = fedhet("spec", "validate", path, cwd=tmp_path)
    assert absent.rc == 2 and len(absent.stderr.strip().splitlines()) == 1
    assert "folder not found" in absent.stderr and "docs/how-to/leaf.md" in absent.stderr
    task = path.stem.removeprefix("fedprox_")
    leaf_folder(tmp_path / "data" / "leaf" / task, task, {f"u{i}": (3, 1) for i in range(10)})
    planned = fedhet("spec", "hash", path, cwd=tmp_path)
    assert planned.rc == 0, planned.stderr
    assert planned.stdout.count("train") >= 2  # FedAvg and FedProx


def test_a_folder_changed_after_planning_is_refused_when_loaded(tmp_path: Path):
    root = leaf_folder(tmp_path / "femnist", "femnist")
    spec = parse_spec(spec_of(root))
    partition_node(spec)  # planned: the keys name the folder as it is now
    file = root / "train" / "part_1.json"
    file.write_text(file.read_text().replace("0.", "0.1", 1))
    with pytest.raises(InputError, match=r"data.path: .*femnist changed while fedhet was using"):
        load_data(spec.data, seed=0)
