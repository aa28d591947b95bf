"""Probe requests as guarded actions: the console's and the CLI's only way to queue, cancel
and schedule probes, or save a workload profile. Each checks the person's role, validates
against the kind and the probe limits, records who asked, and lands in the audit log.

A destructive kind (the OOM probe) also needs a typed confirmation: the target's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from planner.errors import InvalidInput
from planner.workload import PRESETS, Profile, parse_profile
from probes.kinds import KINDS, RUN_KEYS, get_kind, parse_params
from probes.kinds.context import ProbeParams
from storage import queries as q
from storage.access import Action, Actor, guarded
from storage.schemas import NAME_RE, ProbeLimits, RunRow, ScheduleRow, TargetRow


def confirmation_needed(kind: str) -> bool:
    """Whether starting this kind needs the target's name typed."""
    return get_kind(kind).destructive


def request_probe(
    store: Engine,
    actor: Actor,
    kind: str,
    target: TargetRow,
    data: Mapping[str, Any],
    limits: ProbeLimits,
    confirm: str | None = None,
) -> RunRow:
    """Queue a probe run on `target` as `actor`; refused (and audited) when the role does not
    allow it, the parameters are bad or over the limits, or a destructive kind's `confirm`
    is not the target's name."""
    with guarded(store, actor, Action.PROBE_RUN, f"{kind} on {target.name}", dict(data)):
        probe = get_kind(kind)
        fields = dict(data)
        if probe.destructive:
            if (confirm or "").strip() != target.name:
                raise InvalidInput(
                    f"the {probe.title} probe {probe.danger} ({target.name}): type the "
                    f"target's name ({target.name}) to confirm"
                )
            fields["confirm"] = True
        params = parse_params(kind, fields, q.stored_profiles(store), limits)
        probe.admit(params, target.managed)
        extra = {k: v for k, v in data.items() if k in RUN_KEYS}
        return q.request_run(
            store, kind, params.model_dump() | extra, target.id, requested_by=str(actor)
        )


def cancel_probe(store: Engine, actor: Actor, run_id: int) -> None:
    """Ask a queued or running probe to stop, as `actor`."""
    with guarded(store, actor, Action.PROBE_CANCEL, f"run {run_id}"):
        run = q.get_run(store, run_id)
        if run.kind not in KINDS:
            raise InvalidInput(f"run {run_id} is a {run.kind}, not a probe: it cannot be cancelled")
        q.cancel_run(store, run_id)


def add_schedule(
    store: Engine,
    actor: Actor,
    kind: str,
    target: TargetRow,
    data: Mapping[str, Any],
    every_s: float,
    limits: ProbeLimits,
) -> ScheduleRow:
    """Run a (non-destructive) probe on `target` every `every_s` seconds, as `actor`."""
    subject = f"{kind} on {target.name} every {every_s:g} s"
    with guarded(store, actor, Action.SCHEDULE_ADD, subject, dict(data)):
        if get_kind(kind).destructive:
            raise InvalidInput(
                f"the {kind} probe cannot be scheduled: it needs a person to confirm"
            )
        params = parse_params(kind, data, q.stored_profiles(store), limits)
        return q.add_schedule(store, target.id, kind, params.model_dump(), every_s)


def remove_schedule(store: Engine, actor: Actor, schedule_id: int) -> None:
    """Delete a probe schedule (its past runs stay), as `actor`."""
    with guarded(store, actor, Action.SCHEDULE_REMOVE, f"schedule {schedule_id}"):
        q.remove_schedule(store, schedule_id)


def begin_local_probe(
    store: Engine,
    actor: Actor,
    kind: str,
    data: Mapping[str, Any],
    limits: ProbeLimits,
    target: TargetRow | None,
    url: str,
) -> tuple[RunRow, ProbeParams]:
    """A probe the caller runs itself (the CLI), admitted as `actor`: validated, stored as
    running with who asked, audited. `target` is the stored target at `url`, if any."""
    subject = f"{kind} on {target.name if target else url}"
    with guarded(store, actor, Action.PROBE_RUN, subject, dict(data)):
        probe = get_kind(kind)
        params = parse_params(kind, data, q.stored_profiles(store), limits)
        probe.admit(params, bool(target and target.managed))
        run = q.start_run(
            store,
            kind,
            params.model_dump() | {"target_url": url},
            target.id if target else None,
            requested_by=str(actor),
        )
        return run, params


def save_profile(store: Engine, actor: Actor, name: str, data: Mapping[str, Any]) -> Profile:
    """Store a workload profile under `name` (validated; not a preset's name), as `actor`."""
    with guarded(store, actor, Action.PROFILE_SAVE, name, dict(data)):
        if not NAME_RE.match(name) or name in PRESETS:
            raise InvalidInput(
                f"profile name {name!r} must be letters, digits, '.', '_' or '-' "
                f"and not a preset ({', '.join(sorted(PRESETS))})"
            )
        profile = parse_profile(dict(data))
        q.save_profile(store, name, profile.model_dump())
        return profile
