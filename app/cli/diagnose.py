"""`kvscope diagnose`: which cause broke the tail, for a stored target over a period, or for
a bare engine URL watched for a window (nothing stored)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from app.cli._shared import parse_age, settings, store


def diagnose(
    target: Annotated[str, typer.Argument(help="a stored target's name, or an engine URL")],
    since: Annotated[
        str, typer.Option(help="stored target: how far back to look (90s, 15m, 1h, 2d)")
    ] = "1h",
    window: Annotated[
        str | None,
        typer.Option(
            help="stored target: the length of each judged window (default 5m); "
            "URL: how long to watch it (default 60s)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    token_env: Annotated[
        str | None,
        typer.Option(help="URL: env variable holding a bearer token (KVSCOPE_TOKEN_*)"),
    ] = None,
) -> None:
    """Name the dominant cause of a worse tail (queueing, kv_pressure, prefill_interference,
    decode_slowdown, errors, down, or none), with its evidence and the runner-up."""
    from storage import queries as q
    from storage.dashboards.diagnosis import Diagnosis
    from storage.dashboards.diagnosis import diagnose as stored
    from storage.schemas import normalize_base_url

    config = settings()
    result: Diagnosis
    if "://" in target:
        from probes.worker.snapshot import snapshot

        window_s = parse_age(window or "60s", "--window")
        base = normalize_base_url(target)
        allow = q.allowlist(store(), config.allowed_hosts)
        if not as_json:
            typer.echo(f"watching {base} for {window_s:g} s ...", err=True)
        result = snapshot(base, window_s, config, allow, token_env)
    else:
        window_s = parse_age(window or "5m", "--window")
        result = stored(store(), target, parse_age(since, "--since"), window_s)
    if as_json:
        typer.echo(json.dumps(result.model_dump(mode="json"), indent=2))
        return
    _print(result)


def _print(result: object) -> None:
    from storage.dashboards.diagnosis import Diagnosis

    assert isinstance(result, Diagnosis)
    typer.echo(f"{result.target}: {result.cause} ({result.explanation})")
    for e in result.evidence:
        typer.echo(f"  {e.series} = {e.value:.4g}: {e.note}")
    typer.echo(f"  runner-up: {result.runner_up}")
    problems = [w for w in result.windows if w.cause != "none"]
    typer.echo(
        f"  {len(problems)} of {len(result.windows)} windows of {result.window_s:g} s named a cause"
    )
