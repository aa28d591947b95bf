"""SLOs, alert rules and the alerts they fire: what users promise and what the worker
checks against it (a rule may take its bound from the SLO that applies to a target)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, select, update

from planner.errors import Conflict, InvalidInput, NotFound
from storage.db import session_factory, transaction
from storage.queries._upsert import upsert_by_name
from storage.schemas import AlertRow
from storage.tables import Alert, AlertRuleRow, Event, SloRow, Target


def save_slo(store: Engine, name: str, spec: dict[str, Any], target_id: int | None) -> None:
    """Create or replace an SLO (validated by the caller)."""
    upsert_by_name(store, SloRow, name, spec=spec, target_id=target_id)


def list_slos(store: Engine) -> list[tuple[int, str, int | None, dict[str, Any]]]:
    """(id, name, target id, spec) of every SLO."""
    with session_factory(store)() as s:
        return [
            (r.id, r.name, r.target_id, dict(r.spec))
            for r in s.scalars(select(SloRow).order_by(SloRow.name))
        ]


def remove_slo(store: Engine, name: str) -> None:
    """Delete an SLO."""
    with transaction(store) as s:
        row = s.scalars(select(SloRow).where(SloRow.name == name)).first()
        if row is None:
            raise NotFound(f"no SLO named {name!r}")
        s.delete(row)


def ensure_rules(store: Engine, defaults: Iterable[dict[str, Any]]) -> int:
    """Install the default alert rules once, when none exist; return how many were added."""
    with transaction(store) as s:
        if s.scalars(select(AlertRuleRow.id).limit(1)).first() is not None:
            return 0
        rows = [AlertRuleRow(name=d["name"], rule=d) for d in defaults]
        s.add_all(rows)
        return len(rows)


def list_rules(store: Engine) -> list[tuple[int, dict[str, Any]]]:
    """(id, rule) of every alert rule, by name."""
    with session_factory(store)() as s:
        return [
            (r.id, dict(r.rule))
            for r in s.scalars(select(AlertRuleRow).order_by(AlertRuleRow.name))
        ]


def save_rule(store: Engine, rule: dict[str, Any], rule_id: int | None = None) -> int:
    """Create a rule, or replace rule `rule_id` (validated by the caller)."""
    try:
        with transaction(store) as s:
            row = s.get(AlertRuleRow, rule_id) if rule_id is not None else None
            if rule_id is not None and row is None:
                raise NotFound(f"no alert rule with id {rule_id}")
            if row is None:
                row = AlertRuleRow(name=rule["name"], rule=rule)
                s.add(row)
            else:
                row.name, row.rule, row.updated_at = rule["name"], rule, time.time()
            s.flush()
            return row.id
    except Conflict as err:
        raise InvalidInput(f"an alert rule named {rule['name']!r} already exists") from err


def remove_rule(store: Engine, rule_id: int) -> None:
    """Delete a rule with its alerts."""
    with transaction(store) as s:
        row = s.get(AlertRuleRow, rule_id)
        if row is None:
            raise NotFound(f"no alert rule with id {rule_id}")
        s.delete(row)


def open_alerts(store: Engine) -> list[AlertRow]:
    """Alerts firing now, most severe and newest first."""
    order = {"critical": 0, "warning": 1, "info": 2}
    rows = alerts(store, state="firing")
    return sorted(rows, key=lambda a: (order.get(a.severity, 3), -a.started_at))


def alerts(
    store: Engine, state: str | None = None, since: float = 0.0, limit: int = 500
) -> list[AlertRow]:
    """Alerts (with rule and target names), newest first."""
    with session_factory(store)() as s:
        q = (
            select(Alert, AlertRuleRow.name, Target.name)
            .join(AlertRuleRow, AlertRuleRow.id == Alert.rule_id)
            .join(Target, Target.id == Alert.target_id)
            .where(Alert.started_at >= since)
            .order_by(Alert.started_at.desc())
            .limit(limit)
        )
        if state is not None:
            q = q.where(Alert.state == state)
        return [
            AlertRow(
                id=a.id,
                rule_id=a.rule_id,
                rule=rule,
                target_id=a.target_id,
                target=target,
                severity=a.severity,
                state=a.state,
                started_at=a.started_at,
                resolved_at=a.resolved_at,
                value=a.value,
                message=a.message,
                acknowledged_by=a.acknowledged_by,
                acknowledged_at=a.acknowledged_at,
            )
            for a, rule, target in s.execute(q)
        ]


def fire_alert(
    store: Engine,
    rule_id: int,
    target_id: int,
    severity: str,
    value: float | None,
    message: str,
    now: float,
) -> int:
    """Open an alert (and its event)."""
    with transaction(store) as s:
        row = Alert(
            rule_id=rule_id,
            target_id=target_id,
            severity=severity,
            value=value,
            message=message,
            started_at=now,
        )
        s.add(row)
        s.add(
            Event(
                ts=now,
                target_id=target_id,
                kind="alert_fired",
                severity=severity,
                message=message,
                data={"rule_id": rule_id, "value": value},
            )
        )
        s.flush()
        return row.id


def update_alert(store: Engine, alert_id: int, value: float | None, message: str) -> None:
    """Refresh the value of a firing alert."""
    with transaction(store) as s:
        s.execute(update(Alert).where(Alert.id == alert_id).values(value=value, message=message))


def acknowledge_alert(store: Engine, alert_id: int, by: str, now: float | None = None) -> None:
    """Mark a firing alert as seen by `by` (it keeps firing until its condition ends)."""
    with transaction(store) as s:
        row = s.get(Alert, alert_id)
        if row is None:
            raise NotFound(f"no alert with id {alert_id}")
        if row.state != "firing":
            raise InvalidInput(f"alert {alert_id} has resolved already; nothing to acknowledge")
        row.acknowledged_by, row.acknowledged_at = by, now or time.time()
        s.add(
            Event(
                ts=row.acknowledged_at,
                target_id=row.target_id,
                kind="alert_acknowledged",
                severity="info",
                message=f"{row.message} (acknowledged by {by})",
                data={"rule_id": row.rule_id, "alert_id": row.id},
                actor=by,
            )
        )


def restore_rules(store: Engine, defaults: Iterable[dict[str, Any]]) -> list[str]:
    """Add back every default rule whose name is not stored; return their names."""
    with transaction(store) as s:
        have = set(s.scalars(select(AlertRuleRow.name)))
        rows = [AlertRuleRow(name=d["name"], rule=d) for d in defaults if d["name"] not in have]
        s.add_all(rows)
        return [r.name for r in rows]


def resolve_alert(store: Engine, alert_id: int, message: str, now: float) -> None:
    """Close an alert (and record its event)."""
    with transaction(store) as s:
        row = s.get(Alert, alert_id)
        if row is None or row.state != "firing":
            return
        row.state, row.resolved_at = "resolved", now
        s.add(
            Event(
                ts=now,
                target_id=row.target_id,
                kind="alert_resolved",
                severity="info",
                message=message,
                data={"rule_id": row.rule_id, "alert_id": row.id, "fired_at": row.started_at},
            )
        )
