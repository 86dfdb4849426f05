"""Method labels (report rows, legends, tables): every method's name as its paper spells it, its
non-default settings in one parenthesis, comma-separated; labels written as before still name
their method's label; no label enters a key."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from fedhet.core.sections import AlgorithmSpec
from fedhet.core.spec import load_spec
from fedhet.core.spec.algorithm import algorithm_configs
from fedhet.execution.labels import named_label
from fedhet.execution.planning import runs_of

# A setting: `symbol=value` or a short phrase; neither holds a comma or a parenthesis
SETTING = re.compile(r"[^\s,()=][^,()=]*(=[^\s,()=][^,()=]*)?")
# Each method with settings that are not its defaults (every setting its label can name)
VARIANTS: dict[str, list[dict]] = {
    "apfl": [{"adaptive": False, "alpha": 0.3}],
    "dann": [{"lam": 0.1, "schedule": "joint"}, {"d_steps_per_g": 3}],
    "fedavg": [
        {"local_momentum": 0.9},
        {"vhl": {"generator": {"kind": "noise"}, "augment": False}, "local_momentum": 0.5},
        {"vhl": {"variant": "naive"}},
    ],
    "fedbabu": [{"finetune_steps": 5, "finetune": "head"}],
    "fedbr": [
        {"tau1": 0.5, "tau2": 0.5, "pairing": "index", "local_momentum": 0.9, "mixup": 0.3},
        {"debias_features": False, "pseudo": {"kind": "mixture", "refresh": "round"}},
        {"debias_classifier": False, "max_step": False},
        {"debias_classifier": False, "debias_features": False},
    ],
    "feddf": [{"server_data": "noise"}],
    "feddyn": [{"alpha_per_client": "uniform"}],
    "fedimpro": [
        {"split": "conv2", "objective": "mixture", "weight": 0.5, "ramp": 0.5},
        {"ramp_rounds": 10, "ramp_cap": True, "momentum": 0.5},
        {"rate_samples": 100},
        {"sample_from": "client", "std_clip": 0.2, "noise_std": 0.1},
    ],
    "fedmix": [{"lam": 0.2, "mean_size": 5, "derivative": "sample"}],
    "fedper": [{"personal_layers": 2}],
    "fedtan_ii": [{"sync_rounds": 10, "frozen_lr_scale": 0.5}],
    "finetune": [{"finetune_steps": 3}],
    "groupdro": [{"eta": 0.1, "mixup_alpha": 0.2}],
    "lgfedavg": [{"global_layers": 2}],
    "mixup": [{"alpha": 0.4}],
    "moon": [{"projection": "none"}],
    "perfedavg": [{"variant": "hf"}],
    "scaffold": [{"correction": "after_step"}],
    "tct": [{"stage2": {"algorithm": "gd"}}],
}


def built_in() -> dict[str, type[AlgorithmSpec]]:
    return {
        name: config
        for name, config in algorithm_configs().items()
        if config.__module__.startswith("fedhet.methods.")
    }


def configs() -> list[AlgorithmSpec]:
    """Every built-in method at its defaults and in each of its VARIANTS."""
    return [
        config(**options)
        for name, config in built_in().items()
        for options in [{}, *VARIANTS.get(name, [])]
    ]


def assert_one_style(label: str, name: str) -> None:
    """`name`, or `name (setting, setting, ...)`."""
    assert label == name or label.startswith(f"{name} (") and label.endswith(")"), label
    settings = label[len(name) + 2 : -1].split(", ") if label != name else []
    for setting in settings:
        assert SETTING.fullmatch(setting), (label, setting)
    assert len(set(settings)) == len(settings), label


def test_every_registered_method_has_a_display_name_in_its_papers_spelling():
    configs = algorithm_configs()
    assert VARIANTS.keys() <= configs.keys()
    for name, config in built_in().items():
        assert config.display_name, name
        assert config.display_name != name, f"{name}: the spec's name, not the paper's"
    # a plug-in that names none is labelled by its spec name
    plug_in = type("Plain", (configs["fedavg"],), {"display_name": None})
    assert plug_in().label() == "fedavg"
    assert configs["fedavg"]().label() == "FedAvg"
    assert configs["pfedme"]().label() == "pFedMe" and configs["scaffold"]().label() == "SCAFFOLD"


def test_labels_of_every_built_in_method_follow_the_one_style():
    labels = set()
    for config in configs():
        name, _ = config.label_parts()
        wrappers = [getattr(config, f) for f in config.objective_fields]
        names = [type(config).display_name, *(w.display_name() for w in wrappers if w)]
        assert name == "+".join(names)
        assert_one_style(config.label(), name)
        labels.add(config.label())
    assert len(labels) == len(configs())  # every variant tells itself apart
    assert "FedBR (tau=0.5/0.5, index pairs, mixup=0.3, momentum=0.9)" in labels
    assert "FedAvg+VHL (noise generator, no aug, momentum=0.5)" in labels


SPECS = sorted(p for p in (REPO / "specs").rglob("*.yaml") if "leaf" not in p.parts)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_row_of_every_spec_follows_the_one_style(path):
    """Matrix axes go into the method's one parenthesis (`FedProx (mu=0.01)`)."""
    for run in runs_of(load_spec(path)):
        name, _ = run.spec.algorithm.label_parts()
        assert_one_style(run.algorithm_label, name)


def test_a_setting_of_a_nested_mapping_is_labelled_as_the_spec_writes_it():
    """fednova_fmnist's settings: not Python's dict repr (`{'low': 2, 'high': 5}`)."""
    settings = {run.setting_label for run in runs_of(load_spec(REPO / "specs/fednova_fmnist.yaml"))}
    assert settings == {
        "system.local_epochs={low: 2, high: 5}",
        "system.local_epochs={low: 2, high: 5}, system.dropout=0.2",
    }


def test_labels_written_before_name_the_label_that_replaced_them():
    labels = [
        "FedAvg (momentum=0.9)",
        "FedProx (mu=0.01)",
        "FedBR (tau=0.5/0.5, index pairs, momentum=0.9)",
        "TCT",
    ]
    assert named_label("FedProx (mu=0.01)", labels) == "FedProx (mu=0.01)"
    assert named_label("fedavg(momentum 0.9)", labels) == "FedAvg (momentum=0.9)"
    assert named_label("fedprox, mu=0.01", labels) == "FedProx (mu=0.01)"
    old_fedbr = "FedBR (tau 0.5/0.5) (index pairs)(momentum 0.9)"
    assert named_label(old_fedbr, labels) == labels[2]
    assert named_label("tct", labels) == "TCT"
    assert named_label("tct", [*labels, "TCT"]) == "TCT"  # a label of several runs: one
    assert named_label("fedavg", labels) is None  # not the momentum row: no silent guess
    assert named_label("x", ["A (b=1)", "a, b=1"]) is None
    assert named_label("a(b 1)", ["A (b=1)", "a, b=1"]) is None  # two labels match: none


@pytest.mark.parametrize("name", ["fedavg", "fedbr", "fedtan_ii"])
def test_labels_enter_no_key(name):
    """Two configs that differ only in the class's display name plan the same key."""
    from fedhet.core.spec import parse_spec
    from fedhet.execution.planning import plan

    spec = parse_spec({"algorithm": {"name": name}, "model": {"norm": "batch"}})
    config = type(spec.algorithm)
    renamed = type("Renamed", (config,), {"display_name": "Something else"})
    other = spec.model_copy(update={"algorithm": renamed(**spec.algorithm.model_dump())})
    assert other.algorithm.label() != spec.algorithm.label()
    assert plan(other).key == plan(spec).key
