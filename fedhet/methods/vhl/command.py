"""`fedhet virtual`: VHL's command, added to the command line through its plug-in (`commands=`).
Light to import: VHL's code is imported when the command runs. Its arguments are those of every
spec command (fedhet.plugin); the CLI's spec loading and consoles come in through the typer
context (`ctx.obj`: load, out, err)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedhet.plugin import (
    ArtifactStore,
    InputError,
    OverridesArg,
    SpecPath,
    StoreOpt,
    expand,
)

commands = typer.Typer()


@commands.command(
    "virtual", epilog="Example:\n\n  $ fedhet virtual specs/vhl_fmnist.yaml --grid grid.png"
)
def virtual(
    ctx: typer.Context,
    path: SpecPath,
    overrides: OverridesArg = None,
    grid: Annotated[
        Path | None,
        typer.Option(help="write a labelled grid of samples, a row per class (.png/.svg/.pdf)"),
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Compute (or reuse) the VHL virtual dataset of every run and print its summary."""
    spec, out, err = ctx.obj.load(path, overrides=overrides), ctx.obj.out, ctx.obj.err
    from fedhet.methods.vhl.generators import save_grid
    from fedhet.methods.vhl.virtual_stage import load_virtual
    from fedhet.plugin import RunContext, ensure

    st = ArtifactStore(store)
    seen = set()
    for _, run_spec in expand(spec):
        node = run_spec.algorithm.objective_upstream(run_spec).get("virtual")
        if node is None or node.key in seen:
            continue
        seen.add(node.key)
        images, labels = load_virtual(ensure(node, RunContext(run_spec, st, err)))
        generator = node.config["generator"]
        out.print(
            f"virtual {node.key[:12]}: {generator['kind']}, {len(labels)} images of shape "
            f"{tuple(images.shape[1:])}, {node.config['classes']} classes"
        )
        if grid is not None:
            target = grid if len(seen) == 1 else grid.with_stem(f"{grid.stem}-{node.key[:8]}")
            save_grid(images, labels, target)
            out.print(f"wrote {target}")
    if not seen:
        raise InputError(
            f"{path}: no run trains on virtual data; set algorithm.vhl (variant vhl or naive)"
        )
