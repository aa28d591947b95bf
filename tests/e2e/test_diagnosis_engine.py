"""Diagnosis on the real CPU engine: each cause injected once (tests/support/injection.py),
each window must get the injected cause, and the quiet one none. The benchmark
(benchmarks/diagnosis.py) repeats the rounds and prints the confusion table."""

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


def test_each_injected_cause_is_named(live: LiveWorker, diag_engine: str) -> None:
    pairs, wrong = [], []
    for cause in injection.CAUSES:
        window = injection.inject(live.request, live.worker, cause)
        verdict, signals = injection.judge(live.worker, window)
        pairs.append((cause, verdict.cause.value))
        if verdict.cause.value != cause:
            wrong.append(f"{cause} named {injection.describe(verdict, signals)}")
    assert not wrong, "\n".join([injection.confusion(pairs), *wrong])


def test_the_ab_probe_shows_what_chunked_prefill_does(live: LiveWorker, diag_engine: str) -> None:
    """Long prompts among short ones. Without chunked prefill a 7,000-token prefill runs in
    one step and every running request stalls for all of it; in 512-token chunks the
    stalls are a chunk long. (Short requests' TTFT is shown beside it: vLLM V1 schedules a
    running chunked prefill before new requests, so they still wait for all of it.) One
    round here, three restarts; benchmarks/ab.py runs more and prints the spread."""
    store = live.worker.store
    before = live.worker.engines[injection.NAME].spec
    run = live.request(
        "ab", target=injection.NAME, timeout=900, confirm=True, rounds=1, rate=2,
        duration_s=15, profile=injection.MIX, request_timeout_s=120,
        a={"enable_chunked_prefill": True, "max_num_batched_tokens": 512},
        b={"enable_chunked_prefill": False, "max_num_batched_tokens": 8192},
    )  # fmt: skip
    assert run.status == "done", run.error
    result = Result.model_validate(run.summary)
    a, b = result.arms
    assert [(x.arm, x.round) for x in result.runs] == [("A", 1), ("B", 1)]
    assert {x.short_class for x in result.runs} == {"prompt <= 512"}
    assert all(x.short_ttft_p99_s and x.itl_p99_s for x in result.runs)
    assert a.itl_max_s is not None and b.itl_max_s is not None
    assert a.itl_max_s < b.itl_max_s / 2, (a, b)
    # The engine runs as before the experiment, and its target is scraped again.
    injection.wait_serving(live.worker)
    assert live.worker.engines[injection.NAME].spec == before
    tid = q.get_target(store, injection.NAME).id
    finished = run.finished_at or 0.0
    restarts = q.events(store, run.created_at, finished, tid, kinds=["engine_starting"])
    assert len(restarts) == 3  # arm A, arm B, and back as it was
