"""A probe pushes the real CPU engine past its KV space: the preemption and KV alerts fire
from the worker's scraped series, and resolve once the load stops."""

from __future__ import annotations

import threading
import time

import pytest

from probes.alerting.evaluate import AlertEvaluator
from probes.alerting.rules import DEFAULT_RULES, RuleKind
from storage import queries as q
from tests.e2e.conftest import LiveWorker

pytestmark = pytest.mark.engine


def test_kv_pressure_fires_and_resolves_the_alerts(live: LiveWorker, cpu_engine: str) -> None:
    store = live.worker.store
    q.ensure_rules(store, [r.model_dump() for r in DEFAULT_RULES])
    # Shorter durations than the defaults, so the test takes a minute, not ten.
    quick = {
        RuleKind.KV_LEVEL: {"threshold": 0.8, "for_s": 4, "window_s": 5},
        RuleKind.PREEMPTIONS: {"threshold": 0.0, "for_s": 4, "window_s": 10},
    }
    names = {}
    for rule_id, data in q.list_rules(store):
        if RuleKind(data["kind"]) in quick:
            q.save_rule(store, data | quick[RuleKind(data["kind"])], rule_id)
            names[RuleKind(data["kind"])] = data["name"]
    # Long prompts arriving faster than they finish: vLLM admits about ten of 1,500 tokens
    # into its 16,384, their answers outgrow what is left within a few hundred steps, and it
    # preempts. (Answers of 1,500 tokens kept the engine busy past the requests' timeout.)
    run = threading.Thread(
        target=live.request,
        args=("latency",),
        kwargs={
            "target": "embedded",
            "timeout": 300,
            "rate": 3,
            "duration_s": 6,
            "prompt_tokens": 1500,
            "output_tokens": 500,
            "request_timeout_s": 240,
        },
    )
    run.start()
    evaluator = AlertEvaluator(store)
    fired: set[str] = set()
    deadline = time.time() + 240
    while run.is_alive() and time.time() < deadline:
        evaluator.run()
        fired |= {a.rule for a in q.open_alerts(store)}
        time.sleep(2)
    run.join()
    assert {names[RuleKind.KV_LEVEL], names[RuleKind.PREEMPTIONS]} <= fired, fired
    # Load gone: both resolve (KV usage falls, the preemption rate drops to zero).
    deadline = time.time() + 120
    while time.time() < deadline:
        evaluator.run()
        still = {a.rule for a in q.open_alerts(store)} & set(names.values())
        if not still:
            break
        time.sleep(2)
    assert not still, still
    events = q.events(store, 0, time.time() + 1, kinds=["alert_fired", "alert_resolved"])
    for kind in ("alert_fired", "alert_resolved"):
        assert any(e.kind == kind and names[RuleKind.KV_LEVEL] in e.message for e in events)
        assert any(e.kind == kind and names[RuleKind.PREEMPTIONS] in e.message for e in events)
