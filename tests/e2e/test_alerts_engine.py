"""A probe pushes the real CPU engine past its KV space: the preemption and KV alerts fire
from the worker's scraped series, and resolve once the load stops."""

from __future__ import annotations

import threading
import time

import pytest

from probes.alerting.evaluate import AlertEvaluator
from probes.alerting.rules import DEFAULT_RULES, RuleKind
from storage import derived as d
from storage import queries as q
from storage.schemas import RunRow
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
    # A burst of long prompts: vLLM admits a request only when its whole prompt fits, so about
    # ten of 1,500 tokens share its 16,384; each answer of 500 grows them past 20,000, so it
    # must preempt whatever the machine's speed (a Poisson trickle sometimes finished early
    # requests before later ones came, and nothing was preempted). Sixty of them keep the
    # cache full for several times the rules' 4 s: twelve held it over 80 % for only 2-3 s,
    # too short for a rule judged from the start of its duration.
    ended: list[RunRow] = []
    run = threading.Thread(
        target=lambda **kw: ended.append(live.request("latency", **kw)),
        kwargs={
            "target": "embedded",
            "timeout": 300,
            "rate": 20,
            "duration_s": 3.0,
            "arrival": "constant",
            "prompt_tokens": 1500,
            "output_tokens": 500,
            "request_timeout_s": 240,
        },
    )
    run.start()
    evaluator = AlertEvaluator(store)
    wanted = {names[RuleKind.KV_LEVEL], names[RuleKind.PREEMPTIONS]}
    fired: set[str] = set()
    # A rule fires only after its condition has held for `for_s`: a preemption late in the run
    # fires after the load has ended, so evaluation goes on a while (within the rule's window).
    began = time.time()
    deadline, after_load = began + 240, None
    while time.time() < deadline:
        evaluator.run()
        fired |= {a.rule for a in q.open_alerts(store)}
        if not run.is_alive():
            after_load = after_load or time.time() + 2 * quick[RuleKind.PREEMPTIONS]["window_s"]
            if wanted <= fired or time.time() > after_load:
                break
        time.sleep(2)
    run.join()
    assert ended and ended[0].status == "done", ended and (ended[0].status, ended[0].error)
    preempted = ended[0].summary.get("preemptions")
    assert preempted, f"the load did not preempt ({preempted}): nothing for the alert to see"
    assert wanted <= fired, (fired, _kv_seen(live, began))
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


def _kv_seen(live: LiveWorker, since: float) -> str:
    """What the worker stored of the engine's KV usage since `since`, for a failure's message."""
    target = q.get_target(live.worker.store, "embedded")
    grid = d.Grid(since, time.time(), 1.0, 0)
    kv = d.gauge(live.worker.store, target.id, "kv_usage", grid).round(2).tolist()
    return f"KV usage each second: {kv}; health {target.health} ({target.health_message})"
