"""`kvscope scrape URL`: one `/metrics` of an engine, as canonical values, nothing stored.
The URL's host must be allowed (loopback, or `kvscope hosts allow`), as for any target."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from app.cli._shared import print_summary, settings, store


def scrape(
    url: Annotated[str, typer.Argument(help="engine base URL or its /metrics URL")],
    once: Annotated[bool, typer.Option("--once", help="scrape one time and exit")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    token_env: Annotated[
        str | None,
        typer.Option(help="env variable holding a bearer token (its name starts KVSCOPE_TOKEN_)"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the engine")] = 5.0,
) -> None:
    """Fetch one /metrics and print the canonical values (p50/p95/p99 since engine start)."""
    from probes.vllm.client import Target, VllmClient
    from probes.vllm.metrics import summarize
    from storage import queries as q
    from storage.schemas import normalize_base_url

    base = normalize_base_url(url)
    allow = q.allowlist(store(), settings().allowed_hosts)
    summary = summarize(VllmClient(Target.resolve(base, token_env, allow=allow)).scrape(timeout))
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
