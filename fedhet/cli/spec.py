"""`fedhet spec`: validate, show, hash a spec and print the JSON Schema of specs. None of them
imports torch: they stay fast."""

from __future__ import annotations

import json

from fedhet.cli.options import SpecArgs, example, group, out, spec_arguments
from fedhet.core.spec import expand

commands = group("Validate, inspect and hash specs.")


@commands.command("validate", epilog=example("fedhet spec validate specs/quickstart.yaml"))
@spec_arguments
def spec_validate(given: SpecArgs) -> None:
    """Check a spec; exit 2 with a one-line message naming the field when it is invalid."""
    runs = expand(given.load())  # no planning: validating imports no method code (and no torch)
    out.print(
        f"{given.path}: valid ({len(runs)} run{'s' if len(runs) != 1 else ''})", soft_wrap=True
    )


@commands.command("show", epilog=example("fedhet spec show specs/quickstart.yaml model.arch=mlp"))
@spec_arguments
def spec_show(given: SpecArgs) -> None:
    """Print the spec with every default filled in (only the fields that apply to the chosen
    model and partition), and the model's split points."""
    spec = given.load()
    import yaml

    from fedhet.core.spec import applicable_dump

    # plain print: rich would wrap long lines and break the YAML
    print(yaml.safe_dump(applicable_dump(spec), sort_keys=False))
    # known from the spec alone: no dataset loaded, no model built (and no torch imported)
    out.print(f"# model split points: {', '.join(spec.model.split_points())}")


@commands.command("hash", epilog=example("fedhet spec hash specs/quickstart.yaml seed=1"))
@spec_arguments
def spec_hash(given: SpecArgs) -> None:
    """Print every stage's key for every run of the spec."""
    spec = given.load()
    from fedhet.execution.planning import runs_of

    for run in runs_of(spec):  # plain print: one unwrapped line per key, for scripts
        print(f"# {run.label}")
        for node in run.node.walk():
            print(f"{node.stage:10s} {node.key}")


@commands.command("schema", epilog=example("fedhet spec schema > spec.schema.json"))
def spec_schema() -> None:
    """Print the JSON Schema of specs (for editor completion and checking)."""
    from fedhet.core.spec import json_schema

    out.print_json(json.dumps(json_schema()))
