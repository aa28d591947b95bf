"""The real CPU engine read through a real Prometheus (Debian's) that scrapes it: the same
engine facts and the same series as the worker's own scrapes of it."""

from __future__ import annotations

import time

import pytest

from storage import queries as q
from storage.dashboards.monitor import series_view
from tests.e2e.conftest import LiveWorker
from tests.support.prometheus import prometheus, wait_scraped
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine


def test_the_cpu_engine_read_through_prometheus(live: LiveWorker, cpu_engine: str) -> None:
    store = live.worker.store
    with prometheus({"vllm-cpu": cpu_engine.split("//", 1)[1]}) as prom:
        wait_scraped(prom, "vllm-cpu")
        spec = {"name": "cpu-via-prometheus", "base_url": prom, "source": "prometheus",
                "selector": '{job="vllm-cpu"}'}  # fmt: skip
        q.add_target(store, q.parse_target(spec))
        try:
            wait_until(
                lambda: q.get_target(store, spec["name"]).num_gpu_blocks is not None, 30,
                "the engine's cache facts read through Prometheus",
            )  # fmt: skip
            time.sleep(3)
            scraped, read = q.get_target(store, "embedded"), q.get_target(store, spec["name"])
            assert read.health == "up", read.health_message
            assert (read.num_gpu_blocks, read.block_size, read.model_name) == (
                scraped.num_gpu_blocks, scraped.block_size, scraped.model_name
            )  # fmt: skip
            names = ["kv_usage", "running", "waiting"]
            views = [series_view(store, n, 60, names) for n in ("embedded", spec["name"])]
            for name in names:  # the engine is idle between tests: both read the same now
                latest = [v.series[name][-1][1] for v in views]
                assert latest[0] is not None and latest[0] == latest[1], (name, latest)
        finally:
            q.remove_target(store, spec["name"])
