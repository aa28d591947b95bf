"""`kvscope series`: a target's canonical series as the Live and Tail pages read them, for
scripts and checks."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli._shared import fmt, parse_age, store


def series(
    target: Annotated[str, typer.Argument(help="a stored target's name")],
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="one series (repeatable): kv_usage, waiting, preemptions_per_s, ttft_p99, "
            "itl_ratio, ... (default: all)"
        ),
    ] = None,
    since: Annotated[str, typer.Option(help="how far back: 90s, 15m, 24h, 30d")] = "15m",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Print a target's series: points (time, value) on the pages' grid; counters as rates
    and histograms as quantiles, derived as the pages derive them."""
    from storage.dashboards.monitor import series_view

    view = series_view(store(), target, parse_age(since, "--since"), metric or None)
    if as_json:
        typer.echo(view.model_dump_json(indent=2))
        return
    source = "raw samples" if not view.resolution else f"{view.resolution} s rollups"
    typer.echo(
        f"{view.target}: {source}, a point every {view.step_s:g} s, rates over "
        f"{view.rate_window_s:g} s; the latest value of each series:"
    )
    for name, points in view.series.items():
        latest = next((v for _, v in reversed(points) if v is not None), None)
        typer.echo(f"  {name:<28} {fmt(latest)}")
