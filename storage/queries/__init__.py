"""Reads and short writes on the store, by area, returning plain data (pydantic rows,
DataFrames); nothing above `storage/` writes SQL.

targets (engines scraped, their health)   events (what happened)   series (stored points,
raw or rolled up)   runs (the work queue)   state (facts the worker publishes)
engines (managed engine specs)   schedules (probe schedules, workload profiles)
records (requests probes sent, with their latencies)   alerts (SLOs, alert rules, alerts)
costs (cost frames)   hosts (the allowed hosts, the allowlist)   leases (which process is
the worker). Every query is re-exported here: `from storage import queries as q`.
"""

from storage.queries.alerts import (
    acknowledge_alert,
    alerts,
    ensure_rules,
    fire_alert,
    list_rules,
    list_slos,
    open_alerts,
    remove_rule,
    remove_slo,
    resolve_alert,
    restore_rules,
    save_rule,
    save_slo,
    update_alert,
)
from storage.queries.costs import cost_frames, save_cost_frame
from storage.queries.engines import (
    get_engine_spec,
    list_engine_specs,
    save_engine_spec,
    set_desired_state,
)
from storage.queries.events import events, record_event
from storage.queries.hosts import (
    allow_host,
    allowlist,
    list_allowed_hosts,
    remove_allowed_host,
)
from storage.queries.leases import LeaseRow, acquire_lease, get_lease, release_lease, renew_lease
from storage.queries.records import add_latency_columns, run_records, target_records
from storage.queries.runs import (
    ACTIVE_STATES,
    FINAL_STATES,
    RUN_STATES,
    cancel_run,
    claim_next_run,
    fail_unknown_runs,
    get_run,
    interrupt_running,
    list_runs,
    queued_count,
    request_run,
    start_run,
    update_run,
)
from storage.queries.schedules import (
    active_run_of_schedule,
    add_schedule,
    list_schedules,
    remove_schedule,
    save_profile,
    stored_profiles,
)
from storage.queries.series import count_samples, series_points
from storage.queries.state import get_state, put_state
from storage.queries.targets import (
    add_target,
    find_target_by_url,
    get_target,
    list_targets,
    parse_target,
    remove_target,
    set_target_health,
    touch_target,
    update_target,
    upsert_managed_target,
)

__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "RUN_STATES",
    "LeaseRow",
    "acknowledge_alert",
    "acquire_lease",
    "active_run_of_schedule",
    "add_latency_columns",
    "add_schedule",
    "add_target",
    "alerts",
    "allow_host",
    "allowlist",
    "cancel_run",
    "claim_next_run",
    "cost_frames",
    "count_samples",
    "ensure_rules",
    "events",
    "fail_unknown_runs",
    "find_target_by_url",
    "fire_alert",
    "get_engine_spec",
    "get_lease",
    "get_run",
    "get_state",
    "get_target",
    "interrupt_running",
    "list_allowed_hosts",
    "list_engine_specs",
    "list_rules",
    "list_runs",
    "list_schedules",
    "list_slos",
    "list_targets",
    "open_alerts",
    "parse_target",
    "put_state",
    "queued_count",
    "record_event",
    "release_lease",
    "remove_allowed_host",
    "remove_rule",
    "remove_schedule",
    "remove_slo",
    "remove_target",
    "renew_lease",
    "request_run",
    "resolve_alert",
    "restore_rules",
    "run_records",
    "save_cost_frame",
    "save_engine_spec",
    "save_profile",
    "save_rule",
    "save_slo",
    "series_points",
    "set_desired_state",
    "set_target_health",
    "start_run",
    "stored_profiles",
    "target_records",
    "touch_target",
    "update_alert",
    "update_run",
    "update_target",
    "upsert_managed_target",
]
