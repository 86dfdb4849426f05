"""`fedhet spec`: validate, show, hash a spec and print the JSON Schema of specs. None of them
imports torch: they stay fast."""

from __future__ import annotations

import json
from itertools import groupby
from operator import itemgetter

from fedhet.cli.options import SpecArgs, example, group, out, spec_arguments

commands = group("Validate, inspect and hash specs.")


@commands.command("validate", epilog=example("fedhet spec validate specs/quickstart.yaml"))
@spec_arguments
def spec_validate(given: SpecArgs) -> None:
    """Check a spec; exit 2 with a one-line message naming the field when it is invalid."""
    runs = given.check().run_specs  # unplanned: validating imports no method code (no torch)
    out.print(
        f"{given.path}: valid ({len(runs)} run{'s' if len(runs) != 1 else ''})", soft_wrap=True
    )


@commands.command("show", epilog=example("fedhet spec show specs/quickstart.yaml model.arch=mlp"))
@spec_arguments
def spec_show(given: SpecArgs) -> None:
    """Print the spec with every default filled in (only the fields that apply to the chosen
    model and partition), and the model's split points."""
    session = given.check()
    import yaml

    # plain print: rich would wrap long lines and break the YAML
    print(yaml.safe_dump(session.filled(), sort_keys=False))
    # known from the spec alone: no dataset loaded, no model built (and no torch imported)
    out.print(f"# model split points: {', '.join(session.spec.model.split_points())}")


@commands.command("hash", epilog=example("fedhet spec hash specs/quickstart.yaml seed=1"))
@spec_arguments
def spec_hash(given: SpecArgs) -> None:
    """Print every stage's key for every run of the spec."""
    for _, grouped in groupby(given.check().key_rows(), key=itemgetter("run")):
        stages = list(grouped)  # plain print: one unwrapped line per key, for scripts
        print(f"# {stages[0]['label']}")
        for row in stages:
            print(f"{row['stage']:10s} {row['key']}")


@commands.command("schema", epilog=example("fedhet spec schema > spec.schema.json"))
def spec_schema() -> None:
    """Print the JSON Schema of specs (for editor completion and checking)."""
    from fedhet.api import schema

    out.print_json(json.dumps(schema()))
