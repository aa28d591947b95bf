"""`kvscope export ...`: the Prometheus alerting rules and the Grafana dashboard as files
(app/exports/), for teams that already run Prometheus and Grafana."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from app.cli._shared import store, write_out

export_app = typer.Typer(
    help="Files for teams that already run Prometheus and Grafana.", no_args_is_help=True
)


@export_app.command("prometheus-rules")
def export_rules(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="file (default: stdout)")] = None,
    job: Annotated[str, typer.Option(help="the Prometheus job that scrapes vLLM")] = "vllm",
    slo: Annotated[
        str | None,
        typer.Option(help="the SLO the burn-rate rules watch (default: the one for every target)"),
    ] = None,
) -> None:
    """The alert rules (as stored, or the defaults) as a Prometheus alerting-rules file."""
    from app.exports import prometheus_rules_yaml
    from app.exports.prometheus import left_out
    from planner.errors import NotFound
    from planner.slo import parse_slo
    from probes.alerting.rules import DEFAULT_RULES, rules_from_rows
    from storage import queries as q

    slos = q.list_slos(store())
    chosen = [spec for _, name, tid, spec in slos if (name == slo if slo else tid is None)]
    if slo and not chosen:
        known = ", ".join(name for _, name, _, _ in slos) or "none stored"
        raise NotFound(f"no SLO named {slo} (SLOs: {known})")
    promise = parse_slo(chosen[0]) if chosen else None
    stored = q.list_rules(store())
    rules = list(DEFAULT_RULES)
    if stored:
        parsed = rules_from_rows(stored)
        names = {rule_id: data.get("name") for rule_id, data in stored}
        for rule_id, reason in parsed.invalid.items():
            typer.echo(f"warning: left out stored rule {names[rule_id]!r}: {reason}", err=True)
        rules = list(parsed.valid.values())
    for name, why in left_out(rules, promise).items():
        typer.echo(f"warning: left out rule {name!r}: {why}", err=True)
    write_out(prometheus_rules_yaml(rules, job=job, slo=promise), out)


@export_app.command("grafana-dashboard")
def export_dashboard(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="file (default: stdout)")] = None,
    datasource: Annotated[
        str, typer.Option(help="Prometheus datasource uid (default: ask at import)")
    ] = "${DS_PROMETHEUS}",
) -> None:
    """A Grafana dashboard with the Live and Tail panels over Prometheus."""
    from app.exports import grafana_dashboard_json

    write_out(grafana_dashboard_json(datasource_uid=datasource), out)
