"""Diagnosis on the real CPU engine: each cause injected once (tests/support/injection.py),
each window must get the injected cause, and the quiet one none. The benchmark
(benchmarks/diagnosis.py) repeats the rounds with the full loads and prints the confusion
table."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from probes.engine.spec import embedded_spec
from probes.kinds.ab import Result
from storage import queries as q
from tests.e2e.conftest import LiveWorker
from tests.support import injection
from tests.support.waiting import free_port

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def diag_engine(live: LiveWorker, cpu_engine: str) -> Iterator[str]:
    """The scenarios' engine beside the session's (which idles meanwhile); stopped after."""
    spec = injection.diag_spec(embedded_spec(live.settings), free_port())
    q.save_engine_spec(live.worker.store, spec.name, spec.model_dump())
    run = live.request("engine_start", timeout=600, name=spec.name)
    assert run.status == "done", run.error
    yield spec.base_url
    live.request("engine_stop", timeout=120, name=spec.name)


# The test's short version: half the benchmark's load where the engine then drains it for
# minutes (a queue of 320 requests; 20 long prompts), which still shows the cause plainly.
SHORT_S = {"queueing": 10.0, "kv_pressure": 10.0}


def test_each_injected_cause_is_named(live: LiveWorker, diag_engine: str) -> None:
    pairs, wrong = [], []
    for cause in injection.CAUSES:
        duration = SHORT_S.get(cause, injection.DURATION_S)
        window = injection.inject(live.request, live.worker, cause, duration_s=duration)
        verdict, signals = injection.judge(live.worker, window)
        pairs.append((cause, verdict.cause.value))
        if verdict.cause.value != cause:
            wrong.append(f"{cause} named {injection.describe(verdict, signals)}")
    assert not wrong, "\n".join([injection.confusion(pairs), *wrong])


def test_the_ab_probe_restarts_the_engine_per_arm_and_puts_it_back(
    live: LiveWorker, diag_engine: str
) -> None:
    """Two arms of one round: each measured after a restart with its settings, the engine
    restarted as it was at the end. What chunked prefill does to the tail is measured by
    benchmarks/ab.py on a quiet machine (README): beside a CPU hog, starved engine steps
    set the worst stall of both arms (1.4 s chunked, 2.5 s whole in one CI run), so this
    test checks the experiment, not the effect."""
    store = live.worker.store
    before = live.worker.engines[injection.NAME].spec
    run = live.request(
        "ab", target=injection.NAME, timeout=900, confirm=True, rounds=1, rate=4,
        duration_s=8, prompt_tokens=64, output_tokens=32, request_timeout_s=120,
        a={"enable_chunked_prefill": True, "max_num_batched_tokens": 512},
        b={"enable_chunked_prefill": False, "max_num_batched_tokens": 8192},
    )  # fmt: skip
    assert run.status == "done", run.error
    result = Result.model_validate(run.summary)
    assert [(x.arm, x.round) for x in result.runs] == [("A", 1), ("B", 1)]
    assert all(x.requests >= 20 and x.errors == 0 for x in result.runs), result.runs
    # Measured, if not large: beside two spinning processes answers can arrive whole.
    figures = [(x.short_ttft_p99_s, x.itl_p99_s, x.itl_max_s) for x in result.runs]
    assert all(v is not None and v >= 0 for f in figures for v in f), figures
    assert [a.settings for a in result.arms] == [
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 512},
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192},
    ]
    # Each arm ran on the engine restarted with its settings, and it runs as before now.
    tid = q.get_target(store, injection.NAME).id
    finished = run.finished_at or 0.0
    started = q.events(store, run.created_at, finished, tid, kinds=["engine_starting"])
    assert len(started) == 3  # arm A, arm B, and back as it was
    injection.wait_serving(live.worker)
    assert live.worker.engines[injection.NAME].spec == before
