"""Guarded changes to alerting: rules saved, removed or restored to the defaults (admins),
alerts acknowledged (operators). Each checks the role and lands in the audit log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from probes.alerting.rules import DEFAULT_RULES, AlertRule, parse_rule
from storage import queries as q
from storage.access import Action, Actor, guarded


def save_rule(
    store: Engine, actor: Actor, data: Mapping[str, Any], rule_id: int | None = None
) -> AlertRule:
    """Create a rule, or replace rule `rule_id`, validated, as `actor`."""
    with guarded(store, actor, Action.RULE_SAVE, str(data.get("name")), dict(data)):
        rule = parse_rule(dict(data))
        q.save_rule(store, rule.model_dump(), rule_id)
        return rule


def remove_rule(store: Engine, actor: Actor, rule_id: int) -> None:
    """Delete a rule with its alerts, as `actor`."""
    with guarded(store, actor, Action.RULE_REMOVE, f"rule {rule_id}"):
        q.remove_rule(store, rule_id)


def restore_default_rules(store: Engine, actor: Actor) -> list[str]:
    """Add back the default rules that are missing (by name), as `actor`."""
    with guarded(store, actor, Action.RULES_RESTORE, "default rules"):
        return q.restore_rules(store, [r.model_dump() for r in DEFAULT_RULES])


def acknowledge_alert(store: Engine, actor: Actor, alert_id: int) -> None:
    """Say that `actor` has seen a firing alert and is on it."""
    with guarded(store, actor, Action.ALERT_ACKNOWLEDGE, f"alert {alert_id}"):
        q.acknowledge_alert(store, alert_id, str(actor))
