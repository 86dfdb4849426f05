"""The arguments and options every spec command takes, declared once as typer `Annotated`
aliases: SPEC, its overrides and --only, --store and --data-root. The command line's commands
(fedhet.cli) and the methods' (through fedhet.plugin) take them alike."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SpecPath = Annotated[Path, typer.Argument(help="YAML experiment spec", metavar="SPEC")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="overrides PATH=VALUE, VALUE in YAML: federation.rounds=100 'matrix.seed=[0,1]'",
        metavar="[PATH=VALUE]...",
        show_default=False,
    ),
]
OnlyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--only",
        help="keep the runs whose matrix AXIS has VALUE (an entry of a section axis by its name), "
        "repeatable (one axis's values add up, axes narrow): --only algorithm=fedprox "
        "--only algorithm=scaffold --only seed=0",
        metavar="AXIS=VALUE",
        show_default=False,
    ),
]
StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="artifact store: a folder or s3://BUCKET/PREFIX (default: FEDHET_STORE or "
        "./artifacts)",
        metavar="DIR|URL",
    ),
]
DataRootOpt = Annotated[
    Path | None,
    typer.Option("--data-root", help="dataset root (default: spec, FEDHET_DATA or ./data)"),
]
