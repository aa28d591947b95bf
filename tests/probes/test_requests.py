"""Probe requests, rule and SLO changes as guarded actions: each role gets what the table
gives it, refusals are audited, and the OOM probe needs the target's name typed."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from planner.errors import Forbidden, InvalidInput
from probes.alerting import changes as alerting
from probes.kinds import requests
from storage import queries as q
from storage.access import Actor, Origin, Role, entries
from storage.access import changes as settings_changes
from storage.schemas import ProbeLimits, TargetRow

VIEWER = Actor("vera", Role.VIEWER, Origin.CONSOLE)
OPERATOR = Actor("omar", Role.OPERATOR, Origin.CONSOLE)
ADMIN = Actor("ada", Role.ADMIN, Origin.CLI)
LIMITS = ProbeLimits()
SLO = {"name": "chat", "ttft_s": 1.0, "tpot_s": 0.1, "share": 0.99, "window_s": 86400}


@pytest.fixture
def target(store: Engine) -> TargetRow:
    return q.add_target(store, q.parse_target({"name": "prod", "base_url": "http://127.0.0.1:1"}))


def test_a_viewer_cannot_queue_a_probe_and_the_refusal_is_audited(
    store: Engine, target: TargetRow
) -> None:
    with pytest.raises(Forbidden, match=r"probe\.run needs the operator role"):
        requests.request_probe(store, VIEWER, "latency", target, {"rate": 1.0}, LIMITS)
    assert q.list_runs(store) == []
    (entry,) = entries(store)
    assert (entry.actor, entry.action, entry.outcome) == ("vera", "probe.run", "refused")


def test_an_operator_queues_a_probe_and_the_run_says_who_asked(
    store: Engine, target: TargetRow
) -> None:
    run = requests.request_probe(store, OPERATOR, "latency", target, {"rate": 1.0}, LIMITS)
    assert q.get_run(store, run.id).requested_by == "omar (operator, console)"
    with pytest.raises(InvalidInput, match="rate"):
        requests.request_probe(
            store, OPERATOR, "latency", target, {"rate": 5000.0}, ProbeLimits(max_rate=10)
        )
    requests.cancel_probe(store, OPERATOR, run.id)
    assert q.get_run(store, run.id).status == "cancelled"
    assert [e.outcome for e in reversed(entries(store))] == ["ok", "failed", "ok"]


def test_the_oom_probe_needs_the_targets_name_and_cannot_be_scheduled(
    store: Engine, target: TargetRow
) -> None:
    assert requests.confirmation_needed("oom") and not requests.confirmation_needed("latency")
    data = {"allow_external": True}
    for typed in (None, "", "prod2", "PROD"):
        with pytest.raises(InvalidInput, match=r"type the target's name \(prod\)"):
            requests.request_probe(store, OPERATOR, "oom", target, data, LIMITS, typed)
    run = requests.request_probe(store, OPERATOR, "oom", target, data, LIMITS, " prod ")
    assert run.params["confirm"] is True
    with pytest.raises(InvalidInput, match="cannot be scheduled"):
        requests.add_schedule(store, ADMIN, "oom", target, data, 3600, LIMITS)
    with pytest.raises(Forbidden, match=r"schedule\.add needs the admin role"):
        requests.add_schedule(store, OPERATOR, "latency", target, {}, 3600, LIMITS)
    assert requests.add_schedule(store, ADMIN, "latency", target, {}, 3600, LIMITS).every_s == 3600


def test_rules_and_slos_belong_to_admins_acknowledging_to_operators(store: Engine) -> None:
    with pytest.raises(Forbidden):
        settings_changes.save_slo(store, OPERATOR, SLO, None)
    assert settings_changes.save_slo(store, ADMIN, SLO, None).name == "chat"
    with pytest.raises(Forbidden):
        alerting.restore_default_rules(store, OPERATOR)
    restored = alerting.restore_default_rules(store, ADMIN)
    assert restored and alerting.restore_default_rules(store, ADMIN) == []
    with pytest.raises(Forbidden):
        alerting.remove_rule(store, OPERATOR, q.list_rules(store)[0][0])
    assert len(q.list_rules(store)) == len(restored)
    with pytest.raises(Forbidden):
        alerting.acknowledge_alert(store, VIEWER, 1)


def test_events_say_who_caused_them(store: Engine) -> None:
    from storage.access import targets as target_access

    target_access.add_target(store, ADMIN, {"name": "t2", "base_url": "http://127.0.0.1:2"})
    (event,) = [e for e in q.events(store, 0, 2e9) if e.kind == "target_added"]
    assert event.actor == "ada (admin, cli)"
