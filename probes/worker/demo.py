"""A light, steady load on the embedded engine, so a fresh console has something to show.

Two requests a second, mostly chat-sized with now and then a long prompt (a head-of-line
blocking moment the Tail page shows), sent by the same open-loop generator the probes use.
Its requests are demo traffic: they move the engine's own metrics and are not stored as
probe records. `kvscope up --no-demo-load` (KVSCOPE_DEMO_LOAD=0) switches it off.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from planner.workload import Arrival, LengthDist, LognormalProfile, MixItem, MixProfile
from probes.load.generator import Bounds, new_client, run_open_loop
from probes.load.workloads import PromptBuilder
from probes.vllm.client import AsyncVllmClient, Target

log = logging.getLogger("kvscope.demo")

DEMO_RATE = 2.0
WINDOW_S = 60.0
DEMO_PROFILE = MixProfile(
    components=[
        MixItem(
            weight=0.95,
            name="chat",
            profile=LognormalProfile(
                prompt=LengthDist(median=120, sigma=0.6, min=8, max=1024),
                output=LengthDist(median=400, sigma=0.6, min=16, max=1500),
            ),
        ),
        MixItem(
            weight=0.05,
            name="long",
            profile=LognormalProfile(
                prompt=LengthDist(median=4000, sigma=0.15, min=3000, max=5000),
                output=LengthDist(median=200, sigma=0.5, min=16, max=512),
            ),
        ),
    ]
)


class DemoLoad:
    """Runs in its own thread with its own event loop; `ready()` gates every window."""

    def __init__(
        self, target: Target, model: str, ready: Callable[[], bool], rate: float = DEMO_RATE
    ) -> None:
        self.target, self.model = target, model
        self.ready, self.rate = ready, rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="kvscope-demo-load", daemon=True)
        self.windows = 0

    def start(self) -> None:
        """Start sending (when the engine is ready)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop at once: requests in flight are cancelled."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _main(self) -> None:
        while not self._stop.is_set():
            if not self.ready():
                self._stop.wait(2.0)
                continue
            try:
                asyncio.run(self._window(self.windows))
            except Exception:  # the engine restarting mid-window, say: try again later
                log.exception("demo load window failed")
                self._stop.wait(5.0)
            self.windows += 1

    async def _window(self, seed: int) -> None:
        """One minute of Poisson arrivals."""
        schedule = Arrival(kind="poisson", rate=self.rate).within(WINDOW_S, seed)
        async with new_client(request_timeout_s=120.0) as http:
            vllm = AsyncVllmClient(self.target, http)
            builder = PromptBuilder(vllm, self.model, seed=seed)
            specs = await builder.build(DEMO_PROFILE.shapes(len(schedule), seed))
            await run_open_loop(
                http,
                vllm.endpoint(self.model),
                specs,
                schedule,
                bounds=Bounds(max_duration_s=WINDOW_S, request_timeout_s=120),
                cancel=lambda: self._stop.is_set() or not self.ready(),
            )
