"""SQLAlchemy 2 typed ORM models: the whole data model of kvscope in one place.

Narrow on purpose (see DESIGN.md): samples are (series_id, ts, value) rows, everything
derived (rates, quantiles) is computed at query time. Timestamps are Unix seconds (float).
The schema is created and evolved by the Alembic migrations in `storage/migrations`.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    """Declarative base; `type_annotation_map` keeps dict columns as JSON."""

    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


def _now() -> float:
    return time.time()


class Target(Base):
    """A vLLM engine kvscope scrapes: managed by kvscope or external (attach mode)."""

    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    base_url: Mapped[str] = mapped_column(String(500))
    managed: Mapped[bool] = mapped_column(Boolean, default=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    model_name: Mapped[str | None] = mapped_column(String(300))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Name of an environment variable holding a bearer token; the token itself is never stored.
    token_env: Mapped[str | None] = mapped_column(String(100))
    health: Mapped[str] = mapped_column(String(20), default="unknown")
    health_message: Mapped[str | None] = mapped_column(Text)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    last_scrape_at: Mapped[float | None] = mapped_column(Float)
    last_success_at: Mapped[float | None] = mapped_column(Float)
    # From vllm:cache_config_info: the engine's own KV cache sizing.
    num_gpu_blocks: Mapped[int | None] = mapped_column(Integer)
    block_size: Mapped[int | None] = mapped_column(Integer)
    cache_dtype: Mapped[str | None] = mapped_column(String(40))
    cache_info: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Overrides of the worker's scrape settings (storage.schemas.ScrapeLimits field names).
    scrape: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # "scrape" (its /metrics), or "prometheus": base_url is a Prometheus server, `selector`
    # the label matchers of the engine's series there.
    source: Mapped[str] = mapped_column(String(20), default="scrape", server_default="scrape")
    selector: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[float] = mapped_column(Float, default=_now)

    series: Mapped[list[Series]] = relationship(
        back_populates="target", cascade="all, delete-orphan", passive_deletes=True
    )


class Series(Base):
    """One time series: (target, canonical metric name, labels). The raw vLLM name rides along."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("target_id", "metric", "labels_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    metric: Mapped[str] = mapped_column(String(100), index=True)
    # Canonical JSON of the labels (sorted keys): the identity used by the unique constraint.
    labels_key: Mapped[str] = mapped_column(String(1000))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    raw_name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20))  # gauge | counter | bucket | sum | count

    target: Mapped[Target] = relationship(back_populates="series")


class Sample(Base):
    """One observation. Unchanged values are not re-stored until a heartbeat is due."""

    __tablename__ = "samples"
    __table_args__ = ({"sqlite_with_rowid": False},)

    series_id: Mapped[int] = mapped_column(
        ForeignKey("series.id", ondelete="CASCADE"), primary_key=True
    )
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class Rollup(Base):
    """Per-series aggregate over a bucket of `resolution` seconds (60 or 3600)."""

    __tablename__ = "rollups"
    __table_args__ = ({"sqlite_with_rowid": False},)

    series_id: Mapped[int] = mapped_column(
        ForeignKey("series.id", ondelete="CASCADE"), primary_key=True
    )
    resolution: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)  # bucket start
    min: Mapped[float] = mapped_column(Float)
    max: Mapped[float] = mapped_column(Float)
    avg: Mapped[float] = mapped_column(Float)
    last: Mapped[float] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer)  # samples taken in the bucket
    # Seconds of the bucket a value covered (each held until the next, at most the staleness
    # bound): `avg` is weighted by it, and a coarser rollup weighs by it again.
    covered_s: Mapped[float | None] = mapped_column(Float)
    # A counter's reset-corrected increase within the bucket (None for other series).
    increase: Mapped[float | None] = mapped_column(Float)


class ProbeRun(Base):
    """A unit of requested work (a probe, a check) and its outcome; the console writes
    `queued` rows, the worker carries them out and writes progress and results back."""

    __tablename__ = "probe_runs"
    __table_args__ = (Index("ix_probe_runs_status", "status"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(50))
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="SET NULL"))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # queued | running | done | failed | cancelled | interrupted | timed_out
    status: Mapped[str] = mapped_column(String(20), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float, default=_now)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    # When a running item must have ended (wall clock, set when it is claimed).
    deadline_at: Mapped[float | None] = mapped_column(Float)
    # Who asked for it ("alice (operator, console)"); None for the worker's own schedules.
    requested_by: Mapped[str | None] = mapped_column(String(200))

    records: Mapped[list[RequestRecord]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )


class RequestRecord(Base):
    """One request a probe sent, with the times that make latency honest."""

    __tablename__ = "request_records"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("probe_runs.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    scheduled_ts: Mapped[float] = mapped_column(Float)
    sent_ts: Mapped[float | None] = mapped_column(Float)
    first_token_ts: Mapped[float | None] = mapped_column(Float)
    end_ts: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20))  # ok | error | cancelled
    http_status: Mapped[int | None] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(40))
    error: Mapped[str | None] = mapped_column(Text)
    itl_summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Every inter-token gap, as a compact list of milliseconds.
    itl_ms: Mapped[list[Any]] = mapped_column(default=list)
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)

    run: Mapped[ProbeRun] = relationship(back_populates="records")


class Event(Base):
    """Something that happened: engine start/crash, target down/up, parsed log line, alert."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_ts", "ts"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    ts: Mapped[float] = mapped_column(Float, default=_now)
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(50))
    severity: Mapped[str] = mapped_column(String(10), default="info")  # info|warning|error
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Who caused it, when a person did ("alice (operator, console)"); None for the system.
    actor: Mapped[str | None] = mapped_column(String(200))


class EngineSpecRow(Base):
    """A managed engine's spec (validated by `probes.engine.spec.EngineSpec`) and desired state."""

    __tablename__ = "engine_specs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    desired_state: Mapped[str] = mapped_column(String(20), default="stopped")  # running|stopped
    # The spec as last started by someone allowed to: what supervision restarts after a
    # crash, so a saved edit takes effect only at the next start or restart.
    started_spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float, default=_now)
    updated_at: Mapped[float] = mapped_column(Float, default=_now)


class ProbeSchedule(Base):
    """A probe the worker queues every `every_s` seconds against a target."""

    __tablename__ = "probe_schedules"

    id: Mapped[int] = mapped_column(primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(50))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    every_s: Mapped[float] = mapped_column(Float)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[float] = mapped_column(Float, default=_now)


class WorkloadProfileRow(Base):
    """A user's workload profile (validated by `probes.load.workloads`), selectable by name."""

    __tablename__ = "workload_profiles"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    profile: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[float] = mapped_column(Float, default=_now)


class SloRow(Base):
    """A promise: TTFT and per-token bounds, the share inside both, over a window."""

    __tablename__ = "slos"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)  # validated by planner.slo
    created_at: Mapped[float] = mapped_column(Float, default=_now)


class AlertRuleRow(Base):
    """An alert rule as the user edited it (validated by `probes.alerting.rules.AlertRule`)."""

    __tablename__ = "alert_rules"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    rule: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_at: Mapped[float] = mapped_column(Float, default=_now)


class Alert(Base):
    """One firing of a rule on a target, open until it resolves."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_state", "state"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    rule_id: Mapped[int] = mapped_column(ForeignKey("alert_rules.id", ondelete="CASCADE"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    severity: Mapped[str] = mapped_column(String(10))
    state: Mapped[str] = mapped_column(String(10), default="firing")  # firing | resolved
    started_at: Mapped[float] = mapped_column(Float, default=_now)
    resolved_at: Mapped[float | None] = mapped_column(Float)
    value: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text)
    # An operator saw it and is on it; it stays firing until its condition ends.
    acknowledged_by: Mapped[str | None] = mapped_column(String(200))
    acknowledged_at: Mapped[float | None] = mapped_column(Float)


class CostFrame(Base):
    """A recorded reserve-vs-violation frame: prices, traffic and a degradation ladder."""

    __tablename__ = "cost_frames"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    inputs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    ladder: Mapped[list[Any]] = mapped_column(default=list)
    updated_at: Mapped[float] = mapped_column(Float, default=_now)


class WorkerState(Base):
    """Small key/value facts the worker publishes for the console (heartbeat, GPU state)."""

    __tablename__ = "worker_state"

    key: Mapped[str] = mapped_column(String(50), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_at: Mapped[float] = mapped_column(Float, default=_now)
    # Counts the writes: what `replace_state` compares (two writes can share a clock tick).
    version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class WorkerLease(Base):
    """Who may run as the worker of this store: one row per lease name, held by one process
    until it stops renewing it (`expires_at`), so two workers never share a store."""

    __tablename__ = "worker_leases"

    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))  # a random id per worker process
    pid: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    acquired_at: Mapped[float] = mapped_column(Float)
    renewed_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class ScrapeClaim(Base):
    """Which worker scrapes a target (several workers on one PostgreSQL store): held while
    renewed (`until`), released when its holder stops or the target moves to another."""

    __tablename__ = "scrape_claims"

    target_id: Mapped[int] = mapped_column(
        ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True
    )
    holder: Mapped[str] = mapped_column(String(64))
    until: Mapped[float] = mapped_column(Float)


class AuditEntry(Base):
    """One state-changing action: who, when, what, its parameters (secrets masked) and its
    outcome. Append-only: triggers in the database refuse UPDATE and DELETE."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_ts", "ts"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    ts: Mapped[float] = mapped_column(Float, default=_now)
    actor: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(20))
    origin: Mapped[str] = mapped_column(String(20))  # console | cli | worker
    action: Mapped[str] = mapped_column(String(60))
    subject: Mapped[str | None] = mapped_column(Text)
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    outcome: Mapped[str] = mapped_column(String(10))  # ok | refused | failed
    message: Mapped[str | None] = mapped_column(Text)


class AllowedHost(Base):
    """A host, address or network targets may point at, beyond loopback."""

    __tablename__ = "allowed_hosts"

    id: Mapped[int] = mapped_column(primary_key=True)
    pattern: Mapped[str] = mapped_column(String(255), unique=True)
    note: Mapped[str | None] = mapped_column(Text)
    added_by: Mapped[str | None] = mapped_column(String(200))
    added_at: Mapped[float] = mapped_column(Float, default=_now)


class SigninFailure(Base):
    """Failed sign-ins of one user name since the last success, and its lockout."""

    __tablename__ = "signin_failures"

    username: Mapped[str] = mapped_column(String(200), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    first_at: Mapped[float] = mapped_column(Float, default=_now)
    locked_until: Mapped[float | None] = mapped_column(Float)
