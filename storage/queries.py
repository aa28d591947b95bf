"""Reads and short writes on the store, returning plain data (pydantic rows, DataFrames).

Pages and the CLI call these; nothing above `storage/` writes SQL. Time-series reads pick
a table by resolution: raw samples, or 1-minute / 1-hour rollups.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
from pydantic import ValidationError
from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from planner.errors import InvalidInput, NotFound, validation_message
from storage.db import session_factory, transaction
from storage.schemas import (
    AlertRow,
    EventRow,
    RunRow,
    ScheduleRow,
    TargetIn,
    TargetRow,
)
from storage.tables import (
    Alert,
    AlertRuleRow,
    CostFrame,
    EngineSpecRow,
    Event,
    ProbeRun,
    ProbeSchedule,
    RequestRecord,
    Rollup,
    Sample,
    Series,
    SloRow,
    Target,
    WorkerState,
    WorkloadProfileRow,
)

RUN_STATES = ("queued", "running", "done", "failed", "cancelled", "interrupted")
ACTIVE_STATES = ("queued", "running")


# --- targets -------------------------------------------------------------------------------


def _target_row(t: Target) -> TargetRow:
    return TargetRow.model_validate(t, from_attributes=True)


def parse_target(data: dict[str, Any]) -> TargetIn:
    """Validate user input for a target; InvalidInput with one line per bad field."""
    try:
        return TargetIn.model_validate(data)
    except ValidationError as err:
        raise InvalidInput(validation_message(err)) from err


def add_target(engine: Engine, spec: TargetIn) -> TargetRow:
    """Store a new target; its name must be free."""
    try:
        with transaction(engine) as s:
            t = Target(**spec.model_dump())
            s.add(t)
            s.flush()
            row = _target_row(t)
    except IntegrityError as err:
        raise InvalidInput(f"a target named {spec.name!r} already exists") from err
    record_event(
        engine, "target_added", f"target {spec.name} added ({spec.base_url})", target_id=row.id
    )
    return row


def update_target(engine: Engine, name: str, spec: TargetIn) -> TargetRow:
    """Change a target's settings; its history stays."""
    try:
        with transaction(engine) as s:
            t = _find(s, name)
            url_changed = t.base_url != spec.base_url
            for key, value in spec.model_dump().items():
                setattr(t, key, value)
            if url_changed:
                t.health, t.health_message, t.consecutive_failures = "unknown", None, 0
            s.flush()
            return _target_row(t)
    except IntegrityError as err:
        raise InvalidInput(f"a target named {spec.name!r} already exists") from err


def remove_target(engine: Engine, name: str) -> None:
    """Delete a target with its series, samples and events."""
    with transaction(engine) as s:
        t = _find(s, name)
        s.delete(t)


def list_targets(engine: Engine, enabled_only: bool = False) -> list[TargetRow]:
    """All targets, by name."""
    with session_factory(engine)() as s:
        q = select(Target).order_by(Target.name)
        if enabled_only:
            q = q.where(Target.enabled.is_(True))
        return [_target_row(t) for t in s.scalars(q)]


def get_target(engine: Engine, key: str | int) -> TargetRow:
    """One target by id (an int), or by name (a str; digits fall back to the id)."""
    with session_factory(engine)() as s:
        return _target_row(_find(s, key))


def _find(s: Session, key: str | int) -> Target:
    # A name wins over an id spelled the same: a target may be named "12".
    if isinstance(key, int):
        t = s.get(Target, key)
    else:
        t = s.scalars(select(Target).where(Target.name == key)).first()
        if t is None and key.isdigit():
            t = s.get(Target, int(key))
    if t is None:
        known = ", ".join(s.scalars(select(Target.name).order_by(Target.name))) or "none"
        what = f"with id {key}" if isinstance(key, int) else f"named {key!r}"
        raise NotFound(f"no target {what}; known targets: {known}")
    return t


def set_target_health(
    engine: Engine,
    target_id: int,
    *,
    ok: bool,
    message: str | None,
    ts: float,
    cache_info: dict[str, str] | None = None,
    model_name: str | None = None,
) -> tuple[str, str]:
    """Record a scrape outcome; return (previous health, new health) for event decisions."""
    with transaction(engine) as s:
        t = s.get(Target, target_id)
        if t is None:
            raise NotFound(f"target {target_id} no longer exists")
        before = t.health
        t.last_scrape_at = ts
        if ok:
            t.health = "degraded" if message else "up"
            t.health_message = message
            t.consecutive_failures = 0
            t.last_success_at = ts
            if model_name:
                t.model_name = model_name
            if cache_info:
                t.cache_info = dict(cache_info)
                t.num_gpu_blocks = _int(cache_info.get("num_gpu_blocks"))
                t.block_size = _int(cache_info.get("block_size"))
                t.cache_dtype = cache_info.get("cache_dtype")
        else:
            t.health = "down"
            t.health_message = message
            t.consecutive_failures += 1
        return before, t.health


def _int(v: str | None) -> int | None:
    try:
        return int(float(v)) if v not in (None, "", "None") else None
    except ValueError:
        return None


# --- events --------------------------------------------------------------------------------


def record_event(
    engine: Engine,
    kind: str,
    message: str,
    *,
    target_id: int | None = None,
    severity: str = "info",
    data: dict[str, Any] | None = None,
    ts: float | None = None,
) -> None:
    """Append one event."""
    with transaction(engine) as s:
        s.add(
            Event(
                ts=ts or time.time(),
                target_id=target_id,
                kind=kind,
                severity=severity,
                message=message,
                data=data or {},
            )
        )


def events(
    engine: Engine,
    start: float,
    end: float,
    target_id: int | None = None,
    kinds: Sequence[str] | None = None,
    limit: int = 1000,
) -> list[EventRow]:
    """Events in [start, end], newest first."""
    with session_factory(engine)() as s:
        q = select(Event).where(Event.ts >= start, Event.ts <= end)
        if target_id is not None:
            q = q.where(Event.target_id == target_id)
        if kinds:
            q = q.where(Event.kind.in_(kinds))
        q = q.order_by(Event.ts.desc()).limit(limit)
        return [EventRow.model_validate(e, from_attributes=True) for e in s.scalars(q)]


# --- time series ---------------------------------------------------------------------------


def series_points(
    engine: Engine,
    target_id: int,
    names: Iterable[str],
    start: float,
    end: float,
    resolution: int = 0,
) -> pd.DataFrame:
    """Stored points of a target's series in [start, end].

    Columns: series_id, metric, labels_key, ts, value (raw), or ts, min, max, avg, last,
    count (rollups, `ts` = bucket start).
    """
    names = list(names)
    if resolution == 0:
        q: Any = (
            select(Series.id, Series.metric, Series.labels_key, Sample.ts, Sample.value)
            .join(Series, Series.id == Sample.series_id)
            .where(
                Series.target_id == target_id,
                Series.metric.in_(names),
                Sample.ts >= start,
                Sample.ts <= end,
            )
            .order_by(Sample.series_id, Sample.ts)
        )
    else:
        q = (
            select(
                Series.id,
                Series.metric,
                Series.labels_key,
                Rollup.ts,
                Rollup.min,
                Rollup.max,
                Rollup.avg,
                Rollup.last,
                Rollup.count,
            )
            .join(Series, Series.id == Rollup.series_id)
            .where(
                Series.target_id == target_id,
                Series.metric.in_(names),
                Rollup.resolution == resolution,
                Rollup.ts >= start,
                Rollup.ts <= end,
            )
            .order_by(Rollup.series_id, Rollup.ts)
        )
    with engine.connect() as conn:
        # Plain tuples: pandas probes each SQLAlchemy Row for attributes, which costs more
        # than the query.
        rows = [tuple(r) for r in conn.execute(q)]
    cols = ["series_id", "metric", "labels_key", "ts"] + (
        ["value"] if resolution == 0 else ["min", "max", "avg", "last", "count"]
    )
    return pd.DataFrame(rows, columns=cols)


def count_samples(engine: Engine, target_id: int | None = None) -> int:
    """How many raw samples are stored (for one target)."""
    with engine.connect() as conn:
        q = select(func.count()).select_from(Sample)
        if target_id is not None:
            q = q.join(Series, Series.id == Sample.series_id).where(Series.target_id == target_id)
        return int(conn.execute(q).scalar_one())


# --- work requests (probe runs) ------------------------------------------------------------


def request_run(
    engine: Engine, kind: str, params: dict[str, Any] | None = None, target_id: int | None = None
) -> RunRow:
    """Queue a unit of work for the worker; the console's only way to make things happen."""
    with transaction(engine) as s:
        run = ProbeRun(kind=kind, params=params or {}, target_id=target_id, status="queued")
        s.add(run)
        s.flush()
        return RunRow.model_validate(run, from_attributes=True)


def get_run(engine: Engine, run_id: int) -> RunRow:
    """One run by id."""
    with session_factory(engine)() as s:
        run = s.get(ProbeRun, run_id)
        if run is None:
            raise NotFound(f"no probe run with id {run_id}")
        return RunRow.model_validate(run, from_attributes=True)


def list_runs(engine: Engine, kind: str | None = None, limit: int = 100) -> list[RunRow]:
    """Newest runs first."""
    with session_factory(engine)() as s:
        q = select(ProbeRun).order_by(ProbeRun.id.desc()).limit(limit)
        if kind:
            q = q.where(ProbeRun.kind == kind)
        return [RunRow.model_validate(r, from_attributes=True) for r in s.scalars(q)]


def claim_next_run(engine: Engine, kinds: Sequence[str]) -> RunRow | None:
    """Atomically move the oldest queued run of a handled kind to `running`."""
    with transaction(engine) as s:
        run = s.scalars(
            select(ProbeRun)
            .where(ProbeRun.status == "queued", ProbeRun.kind.in_(kinds))
            .order_by(ProbeRun.id)
            .limit(1)
        ).first()
        if run is None:
            return None
        claimed = s.execute(
            update(ProbeRun)
            .where(ProbeRun.id == run.id, ProbeRun.status == "queued")
            .values(status="running", started_at=time.time())
        ).rowcount  # type: ignore[attr-defined]
        if not claimed:
            return None
        s.refresh(run)
        return RunRow.model_validate(run, from_attributes=True)


def fail_unknown_runs(engine: Engine, kinds: Sequence[str]) -> int:
    """Fail queued runs no handler exists for, so they do not wait forever."""
    with transaction(engine) as s:
        runs = s.scalars(
            select(ProbeRun).where(ProbeRun.status == "queued", ProbeRun.kind.not_in(kinds))
        ).all()
        for run in runs:
            run.status, run.finished_at = "failed", time.time()
            run.error = (
                f"this worker has no handler for '{run.kind}' runs; "
                f"it handles: {', '.join(sorted(kinds))}"
            )
        return len(runs)


def update_run(engine: Engine, run_id: int, **values: Any) -> None:
    """Write progress, summary or a final status of a run."""
    if "status" in values and values["status"] not in RUN_STATES:
        raise InvalidInput(f"unknown run status {values['status']!r}")
    if values.get("status") in ("done", "failed", "cancelled", "interrupted"):
        values.setdefault("finished_at", time.time())
    with transaction(engine) as s:
        s.execute(update(ProbeRun).where(ProbeRun.id == run_id).values(**values))


def cancel_run(engine: Engine, run_id: int) -> None:
    """Ask for a run to stop; a queued run is cancelled at once."""
    with transaction(engine) as s:
        run = s.get(ProbeRun, run_id)
        if run is None:
            raise NotFound(f"no probe run with id {run_id}")
        if run.status == "queued":
            run.status, run.finished_at = "cancelled", time.time()
        elif run.status == "running":
            run.cancel_requested = True


def interrupt_running(engine: Engine, reason: str) -> int:
    """Mark runs left `running` by a dead worker as interrupted."""
    with transaction(engine) as s:
        runs = s.scalars(select(ProbeRun).where(ProbeRun.status == "running")).all()
        for run in runs:
            run.status, run.error, run.finished_at = "interrupted", reason, time.time()
        return len(runs)


# --- worker state --------------------------------------------------------------------------


def put_state(engine: Engine, key: str, value: dict[str, Any]) -> None:
    """Publish a small fact (heartbeat, GPU state) for the console."""
    with transaction(engine) as s:
        row = s.get(WorkerState, key)
        if row is None:
            s.add(WorkerState(key=key, value=value, updated_at=time.time()))
        else:
            row.value, row.updated_at = value, time.time()


def get_state(engine: Engine, key: str) -> tuple[dict[str, Any], float] | None:
    """A published fact and when it was written."""
    with session_factory(engine)() as s:
        row = s.get(WorkerState, key)
        return (dict(row.value), row.updated_at) if row else None


# --- managed engines -----------------------------------------------------------------------


def save_engine_spec(engine: Engine, name: str, spec: dict[str, Any]) -> None:
    """Create or replace the stored spec of a managed engine (validated by the caller)."""
    with transaction(engine) as s:
        row = s.scalars(select(EngineSpecRow).where(EngineSpecRow.name == name)).first()
        if row is None:
            s.add(EngineSpecRow(name=name, spec=spec))
        else:
            row.spec, row.updated_at = spec, time.time()


def get_engine_spec(engine: Engine, name: str) -> tuple[dict[str, Any], str]:
    """(spec, desired state) of a managed engine."""
    with session_factory(engine)() as s:
        row = s.scalars(select(EngineSpecRow).where(EngineSpecRow.name == name)).first()
        if row is None:
            known = ", ".join(s.scalars(select(EngineSpecRow.name))) or "none"
            raise NotFound(f"no engine spec named {name!r}; known engines: {known}")
        return dict(row.spec), row.desired_state


def list_engine_specs(engine: Engine) -> list[tuple[str, dict[str, Any], str]]:
    """(name, spec, desired state) of every managed engine."""
    with session_factory(engine)() as s:
        rows = s.scalars(select(EngineSpecRow).order_by(EngineSpecRow.name))
        return [(r.name, dict(r.spec), r.desired_state) for r in rows]


def set_desired_state(engine: Engine, name: str, state: str) -> None:
    """Record whether a managed engine should run (the worker restarts it after a crash)."""
    if state not in ("running", "stopped"):
        raise InvalidInput(f"desired state must be running or stopped, not {state!r}")
    with transaction(engine) as s:
        row = s.scalars(select(EngineSpecRow).where(EngineSpecRow.name == name)).first()
        if row is None:
            raise NotFound(f"no engine spec named {name!r}")
        row.desired_state, row.updated_at = state, time.time()


def upsert_managed_target(
    engine: Engine,
    name: str,
    base_url: str,
    enabled: bool,
    health: str | None = None,
    message: str | None = None,
) -> int:
    """The target a managed engine is scraped as; created on first start."""
    with transaction(engine) as s:
        t = s.scalars(select(Target).where(Target.name == name)).first()
        if t is None:
            t = Target(name=name, base_url=base_url, managed=True)
            s.add(t)
        t.base_url, t.managed, t.enabled = base_url, True, enabled
        if health is not None:
            t.health, t.health_message = health, message
            t.consecutive_failures = 0
        s.flush()
        return t.id


def start_run(
    engine: Engine, kind: str, params: dict[str, Any], target_id: int | None = None
) -> RunRow:
    """A run carried out by the caller itself (the CLI): stored as running, never queued, so
    no worker picks it up."""
    with transaction(engine) as s:
        run = ProbeRun(
            kind=kind, params=params, target_id=target_id, status="running", started_at=time.time()
        )
        s.add(run)
        s.flush()
        return RunRow.model_validate(run, from_attributes=True)


def find_target_by_url(engine: Engine, base_url: str) -> TargetRow | None:
    """The stored target with this base URL, if any."""
    with session_factory(engine)() as s:
        t = s.scalars(select(Target).where(Target.base_url == base_url)).first()
        return _target_row(t) if t else None


# --- schedules, stored workload profiles, request records ----------------------------------


def add_schedule(
    engine: Engine, target_id: int, kind: str, params: dict[str, Any], every_s: float
) -> ScheduleRow:
    """Store a probe schedule (parameters validated by the caller)."""
    if every_s < 10:
        raise InvalidInput(f"a schedule runs at most every 10 s, not every {every_s:g} s")
    with transaction(engine) as s:
        row = ProbeSchedule(target_id=target_id, kind=kind, params=params, every_s=every_s)
        s.add(row)
        s.flush()
        return ScheduleRow.model_validate(row, from_attributes=True)


def list_schedules(engine: Engine, enabled_only: bool = False) -> list[ScheduleRow]:
    """Every probe schedule."""
    with session_factory(engine)() as s:
        q = select(ProbeSchedule).order_by(ProbeSchedule.id)
        if enabled_only:
            q = q.where(ProbeSchedule.enabled.is_(True))
        return [ScheduleRow.model_validate(r, from_attributes=True) for r in s.scalars(q)]


def remove_schedule(engine: Engine, schedule_id: int) -> None:
    """Delete a probe schedule (its past runs stay)."""
    with transaction(engine) as s:
        row = s.get(ProbeSchedule, schedule_id)
        if row is None:
            raise NotFound(f"no probe schedule with id {schedule_id}")
        s.delete(row)


def active_run_of_schedule(engine: Engine, schedule_id: int) -> bool:
    """Whether a run this schedule queued is still queued or running."""
    with session_factory(engine)() as s:
        runs = s.scalars(select(ProbeRun).where(ProbeRun.status.in_(ACTIVE_STATES))).all()
        return any(r.params.get("schedule_id") == schedule_id for r in runs)


def save_profile(engine: Engine, name: str, profile: dict[str, Any]) -> None:
    """Store a workload profile under a name (validated by the caller)."""
    with transaction(engine) as s:
        row = s.scalars(select(WorkloadProfileRow).where(WorkloadProfileRow.name == name)).first()
        if row is None:
            s.add(WorkloadProfileRow(name=name, profile=profile))
        else:
            row.profile = profile


def stored_profiles(engine: Engine) -> dict[str, dict[str, Any]]:
    """Every stored workload profile by name."""
    with session_factory(engine)() as s:
        return {r.name: dict(r.profile) for r in s.scalars(select(WorkloadProfileRow))}


def run_records(engine: Engine, run_id: int) -> pd.DataFrame:
    """The requests a run sent, one row each, with TTFT, E2E and TPOT in seconds."""
    cols = [
        RequestRecord.seq,
        RequestRecord.scheduled_ts,
        RequestRecord.sent_ts,
        RequestRecord.first_token_ts,
        RequestRecord.end_ts,
        RequestRecord.prompt_tokens,
        RequestRecord.output_tokens,
        RequestRecord.status,
        RequestRecord.http_status,
        RequestRecord.error,
        RequestRecord.tags,
    ]
    with engine.connect() as conn:
        rows = conn.execute(
            select(*cols).where(RequestRecord.run_id == run_id).order_by(RequestRecord.seq)
        ).all()
    frame = pd.DataFrame(rows, columns=[c.key for c in cols])
    frame["ttft_s"] = frame["first_token_ts"] - frame["scheduled_ts"]
    frame["e2e_s"] = frame["end_ts"] - frame["scheduled_ts"]
    frame["lateness_s"] = frame["sent_ts"] - frame["scheduled_ts"]
    decode = frame["end_ts"] - frame["first_token_ts"]
    frame["tpot_s"] = decode / (frame["output_tokens"] - 1).where(frame["output_tokens"] > 1)
    frame["step"] = [t.get("step") if isinstance(t, dict) else None for t in frame["tags"]]
    return frame


# --- SLOs, alert rules and alerts, cost frames ----------------------------------------------


def save_slo(engine: Engine, name: str, spec: dict[str, Any], target_id: int | None) -> None:
    """Create or replace an SLO (validated by the caller)."""
    with transaction(engine) as s:
        row = s.scalars(select(SloRow).where(SloRow.name == name)).first()
        if row is None:
            s.add(SloRow(name=name, spec=spec, target_id=target_id))
        else:
            row.spec, row.target_id = spec, target_id


def list_slos(engine: Engine) -> list[tuple[int, str, int | None, dict[str, Any]]]:
    """(id, name, target id, spec) of every SLO."""
    with session_factory(engine)() as s:
        return [
            (r.id, r.name, r.target_id, dict(r.spec))
            for r in s.scalars(select(SloRow).order_by(SloRow.name))
        ]


def remove_slo(engine: Engine, name: str) -> None:
    """Delete an SLO."""
    with transaction(engine) as s:
        row = s.scalars(select(SloRow).where(SloRow.name == name)).first()
        if row is None:
            raise NotFound(f"no SLO named {name!r}")
        s.delete(row)


def ensure_rules(engine: Engine, defaults: Iterable[dict[str, Any]]) -> int:
    """Install the default alert rules once, when none exist; return how many were added."""
    with transaction(engine) as s:
        if s.scalars(select(AlertRuleRow.id).limit(1)).first() is not None:
            return 0
        rows = [AlertRuleRow(name=d["name"], rule=d) for d in defaults]
        s.add_all(rows)
        return len(rows)


def list_rules(engine: Engine) -> list[tuple[int, dict[str, Any]]]:
    """(id, rule) of every alert rule, by name."""
    with session_factory(engine)() as s:
        return [
            (r.id, dict(r.rule))
            for r in s.scalars(select(AlertRuleRow).order_by(AlertRuleRow.name))
        ]


def save_rule(engine: Engine, rule: dict[str, Any], rule_id: int | None = None) -> int:
    """Create a rule, or replace rule `rule_id` (validated by the caller)."""
    try:
        with transaction(engine) as s:
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
    except IntegrityError as err:
        raise InvalidInput(f"an alert rule named {rule['name']!r} already exists") from err


def remove_rule(engine: Engine, rule_id: int) -> None:
    """Delete a rule with its alerts."""
    with transaction(engine) as s:
        row = s.get(AlertRuleRow, rule_id)
        if row is None:
            raise NotFound(f"no alert rule with id {rule_id}")
        s.delete(row)


def open_alerts(engine: Engine) -> list[AlertRow]:
    """Alerts firing now, most severe and newest first."""
    order = {"critical": 0, "warning": 1, "info": 2}
    rows = alerts(engine, state="firing")
    return sorted(rows, key=lambda a: (order.get(a.severity, 3), -a.started_at))


def alerts(
    engine: Engine, state: str | None = None, since: float = 0.0, limit: int = 500
) -> list[AlertRow]:
    """Alerts (with rule and target names), newest first."""
    with session_factory(engine)() as s:
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
            )
            for a, rule, target in s.execute(q)
        ]


def fire_alert(
    engine: Engine,
    rule_id: int,
    target_id: int,
    severity: str,
    value: float | None,
    message: str,
    now: float,
) -> int:
    """Open an alert (and its event)."""
    with transaction(engine) as s:
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


def update_alert(engine: Engine, alert_id: int, value: float | None, message: str) -> None:
    """Refresh the value of a firing alert."""
    with transaction(engine) as s:
        s.execute(update(Alert).where(Alert.id == alert_id).values(value=value, message=message))


def resolve_alert(engine: Engine, alert_id: int, message: str, now: float) -> None:
    """Close an alert (and record its event)."""
    with transaction(engine) as s:
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


def save_cost_frame(engine: Engine, name: str, inputs: dict[str, Any], ladder: list[Any]) -> None:
    """Record a cost frame (inputs and ladder validated by the caller)."""
    with transaction(engine) as s:
        row = s.scalars(select(CostFrame).where(CostFrame.name == name)).first()
        if row is None:
            s.add(CostFrame(name=name, inputs=inputs, ladder=ladder))
        else:
            row.inputs, row.ladder, row.updated_at = inputs, ladder, time.time()


def cost_frames(engine: Engine) -> dict[str, tuple[dict[str, Any], list[Any]]]:
    """Every recorded cost frame: name -> (inputs, ladder)."""
    with session_factory(engine)() as s:
        return {r.name: (dict(r.inputs), list(r.ladder)) for r in s.scalars(select(CostFrame))}


def target_records(engine: Engine, target_id: int, start: float, end: float) -> pd.DataFrame:
    """Requests probes sent to a target, scheduled in [start, end]: ttft_s, tpot_s, ok."""
    cols = [
        RequestRecord.scheduled_ts,
        RequestRecord.first_token_ts,
        RequestRecord.end_ts,
        RequestRecord.output_tokens,
        RequestRecord.status,
    ]
    with engine.connect() as conn:
        rows = conn.execute(
            select(*cols)
            .join(ProbeRun, ProbeRun.id == RequestRecord.run_id)
            .where(
                ProbeRun.target_id == target_id,
                RequestRecord.scheduled_ts >= start,
                RequestRecord.scheduled_ts <= end,
                RequestRecord.status != "cancelled",
            )
        ).all()
    frame = pd.DataFrame(rows, columns=[c.key for c in cols])
    frame["ok"] = frame["status"] == "ok"
    frame["ttft_s"] = frame["first_token_ts"] - frame["scheduled_ts"]
    many = frame["output_tokens"] > 1
    frame["tpot_s"] = (
        (frame["end_ts"] - frame["first_token_ts"]) / (frame["output_tokens"] - 1)
    ).where(many)
    return frame
