"""`kvscope target ...`: attach, list and remove the engines the worker scrapes, as guarded
actions of the machine's owner (audited; a host off the allowlist is refused)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from app.cli._shared import owner, settings, store

target_app = typer.Typer(help="Manage the engines kvscope scrapes.", no_args_is_help=True)


@target_app.command("add")
def target_add(
    name: Annotated[str, typer.Argument(help="a short unique name")],
    url: Annotated[
        str | None, typer.Argument(help="engine base URL, e.g. http://10.0.0.5:8000")
    ] = None,
    token_env: Annotated[
        str | None,
        typer.Option(
            help="env variable holding a bearer token; its name starts KVSCOPE_TOKEN_ "
            "(e.g. KVSCOPE_TOKEN_PROD), set in the worker's environment"
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(help="name=value, repeatable: where it belongs (model, pool, region)"),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            help="read the engine's series from this Prometheus server (which scrapes it) "
            "instead of scraping the engine"
        ),
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option(help='with --prometheus: the engine\'s series there, {job="vllm",...}'),
    ] = None,
) -> None:
    """Attach an external vLLM engine; the worker starts scraping it (or reading it from
    Prometheus) within a second. Its host must be loopback or allowed (`kvscope hosts allow
    HOST`)."""
    from planner.errors import InvalidInput
    from storage.access import targets
    from storage.schemas import parse_labels

    if (url is None) == (prometheus is None):
        raise InvalidInput("give the engine's URL, or --prometheus URL (and --selector), not both")
    labels = parse_labels(label or [])
    data = {"name": name, "base_url": url, "token_env": token_env, "labels": labels}
    if prometheus is not None:
        data |= {"base_url": prometheus, "source": "prometheus", "selector": selector}
    row = targets.add_target(store(), owner(), data, settings().allowed_hosts)
    via = f", read from Prometheus as {row.selector}" if row.source == "prometheus" else ""
    typer.echo(f"added target {row.name} ({row.base_url}{via})")


@target_app.command("list")
def target_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List targets with their health."""
    from storage import queries as q

    rows = q.list_targets(store())
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in rows], indent=2))
        return
    for r in rows:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r.labels.items()))
        where = r.base_url if r.source == "scrape" else f"{r.base_url} {r.selector} (Prometheus)"
        typer.echo(
            f"{r.name:<20} {r.health:<9} {where}  {labels}  {r.health_message or ''}".rstrip()
        )


@target_app.command("remove")
def target_remove(name: Annotated[str, typer.Argument()]) -> None:
    """Remove a target and its stored history."""
    from storage.access import targets

    targets.remove_target(store(), owner(), name)
    typer.echo(f"removed target {name}")
