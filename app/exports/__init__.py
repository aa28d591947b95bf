"""Files for teams that already run Prometheus and Grafana, built from kvscope's own
definitions: its alert rules as Prometheus alerting rules, its Live and Tail pages as a
Grafana dashboard. Pure functions, no I/O; docs/exports.md explains each query.

promql (building blocks: durations, literals, every spelling of a metric, rates and
quantiles)   prometheus (the rules document and its YAML)   yamlout (the small YAML
writer)   grafana (the dashboard model and its JSON).
"""

from __future__ import annotations

from app.exports.grafana import (
    DASHBOARD_UID,
    SCHEMA_VERSION,
    grafana_dashboard,
    grafana_dashboard_json,
)
from app.exports.prometheus import prometheus_rules, prometheus_rules_yaml
from app.exports.promql import duration
from app.exports.yamlout import to_yaml

__all__ = [
    "DASHBOARD_UID",
    "SCHEMA_VERSION",
    "duration",
    "grafana_dashboard",
    "grafana_dashboard_json",
    "prometheus_rules",
    "prometheus_rules_yaml",
    "to_yaml",
]
