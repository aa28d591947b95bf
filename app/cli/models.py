"""`kvscope model ...`: the local models the embedded engine serves (nothing from a hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli._shared import settings
from planner.errors import InvalidInput

model_app = typer.Typer(help="Local models for the embedded engine.", no_args_is_help=True)


@model_app.command("build-tiny")
def model_build_tiny(
    out: Annotated[Path | None, typer.Option(help="default: DATA_DIR/models/tiny-llama")] = None,
    layers: Annotated[int, typer.Option()] = 2,
    kv_heads: Annotated[int, typer.Option()] = 2,
    head_dim: Annotated[int, typer.Option()] = 32,
    dtype: Annotated[str, typer.Option()] = "float32",
) -> None:
    """Build the tiny random-weight Llama and its tokenizer locally (once; nothing from a hub)."""
    from probes.engine.spec import build_tiny_model
    from probes.engine.venv.tinymodel import TinyParams

    try:
        params = TinyParams(
            layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype
        ).resolved()
    except ValueError as err:
        raise InvalidInput(str(err)) from err
    typer.echo(str(build_tiny_model(settings(), out, params)))
