"""The demo load sends steady traffic only while the engine is ready, and stops at once."""

from __future__ import annotations

import time

from probes.vllm.client import Target
from probes.worker.demo import DemoLoad
from tests.support.fake_openai import FakeConfig, serve


def test_demo_load_waits_for_ready_sends_and_stops() -> None:
    ready = {"now": False}
    with serve(FakeConfig(itl_s=0.001)) as fake:
        demo = DemoLoad(Target(fake.url), "m", ready=lambda: ready["now"], rate=20.0)
        demo.start()
        time.sleep(0.5)
        assert fake.generations == 0  # the engine is not up yet: nothing is sent
        ready["now"] = True
        deadline = time.time() + 20
        while fake.generations < 10 and time.time() < deadline:
            time.sleep(0.1)
        t0 = time.time()
        demo.stop()
        assert time.time() - t0 < 5
        assert fake.generations >= 10
        sent = fake.generations
        time.sleep(0.5)
        assert fake.generations == sent  # stopped means stopped
