"""Fill a store with a few minutes of realistic history through the real parse/write path."""

from __future__ import annotations

import math
import random
import time

from sqlalchemy import Engine

from probes.vllm.metrics import parse_metrics
from storage import queries as q
from storage.ingest import SampleWriter
from storage.rollups import run_rollups
from tests.support.fake_vllm import FakeVllm


def seed(
    store: Engine,
    name: str = "demo",
    minutes: float = 5.0,
    step_s: float = 2.0,
    seed_value: int = 0,
) -> int:
    """Write `minutes` of scrapes of a busy engine ending now; return the target id."""
    rng = random.Random(seed_value)
    tid = q.add_target(store, q.parse_target({"name": name, "base_url": "http://127.0.0.1:1"})).id
    fake = FakeVllm()
    writer = SampleWriter(store)
    now = time.time()
    t = now - minutes * 60
    i = 0
    while t <= now:
        phase = math.sin(i / 15.0)
        fake.kv_usage = min(1.0, 0.45 + 0.35 * phase + rng.uniform(-0.03, 0.03))
        fake.running = max(0, round(8 + 6 * phase))
        fake.waiting = max(0, round(3 * phase))
        fake.preemptions += rng.choice([0, 0, 0, 1]) if phase > 0.6 else 0
        fake.prompt_tokens += rng.randint(800, 1200)
        fake.generation_tokens += rng.randint(300, 500)
        fake.prefix_queries += 1000
        fake.prefix_hits += rng.randint(200, 600)
        for _ in range(rng.randint(3, 6)):
            fake.ttft.observe(rng.lognormvariate(math.log(0.08 + 0.05 * max(phase, 0)), 0.5))
            fake.e2e.observe(rng.lognormvariate(math.log(2.0), 0.4))
            fake.tpot.observe(rng.lognormvariate(math.log(0.03), 0.3))
        for _ in range(40):
            fake.itl.observe(rng.lognormvariate(math.log(0.03), 0.3))
        parsed = parse_metrics(fake.text())
        writer.write(tid, parsed.samples, t)
        q.set_target_health(
            store,
            tid,
            ok=True,
            message=None,
            ts=t,
            cache_info=parsed.cache_info,
            model_name=parsed.model_name,
        )
        t += step_s
        i += 1
    q.record_event(store, "target_up", f"{name} seeded", target_id=tid, ts=now - 60)
    run_rollups(store, now=now)
    return tid
