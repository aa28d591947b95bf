"""Diagnosis on the real CPU engine: each cause injected once (tests/support/injection.py),
each window must get the injected cause, and the quiet one none. The benchmark
(benchmarks/diagnosis.py) repeats the rounds and prints the confusion table."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from probes.engine.spec import embedded_spec
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
