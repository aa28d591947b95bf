"""`kvscope hosts allow|list|remove`: the hosts and networks targets may point at beyond
loopback. Link-local and cloud metadata addresses are refused whatever is allowed."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from app.cli._shared import owner, settings, store

hosts_app = typer.Typer(
    help="Allow the hosts and networks targets may point at (loopback always is).",
    no_args_is_help=True,
)


@hosts_app.command("allow")
def hosts_allow(
    host: Annotated[
        str,
        typer.Argument(
            help="a host name (*.example.com for its subdomains), an address or a "
            "network, e.g. vllm.corp, 10.0.0.5, 10.0.0.0/8"
        ),
    ],
    note: Annotated[str | None, typer.Option(help="why it is allowed, for the others")] = None,
) -> None:
    """Let targets point at HOST, on any port; the worker applies it within seconds."""
    from storage.access import targets

    row = targets.allow_host(store(), owner(), host, note, settings().allowed_hosts)
    typer.echo(f"allowed {row.pattern}")


@hosts_app.command("list")
def hosts_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the allowed hosts: those of KVSCOPE_ALLOWED_HOSTS, then those allowed here."""
    from storage.access import targets
    from storage.outbound import REFUSED_NETWORKS

    rows = targets.allowed_hosts(store(), settings().allowed_hosts)
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in rows], indent=2))
        return
    typer.echo(f"{'localhost, 127.0.0.0/8, ::1':<32} always")
    for r in rows:
        by = f"by {r.added_by}" if r.added_by else "KVSCOPE_ALLOWED_HOSTS"
        typer.echo(f"{r.pattern:<32} {by}  {r.note or ''}".rstrip())
    never = ", ".join(str(n) for n in REFUSED_NETWORKS)
    typer.echo(f"never: {never} and cloud metadata names")


@hosts_app.command("remove")
def hosts_remove(host: Annotated[str, typer.Argument(help="an entry as listed")]) -> None:
    """Stop allowing HOST: targets on it are refused from the worker's next sync."""
    from storage.access import targets

    targets.remove_host(store(), owner(), host, settings().allowed_hosts)
    typer.echo(f"removed {host}")
