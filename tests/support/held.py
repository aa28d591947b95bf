"""A burst sent while vLLM's scheduler is paused, so it reaches the scheduler whole however
starved the API server is (on two busy cores a burst sent as it comes trickled in over
seconds). vLLM serves `/pause` and `/resume` in its dev mode only: an engine spec made by
`dev_mode`, outside the allowlists (the owner's --allow-unsafe)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from sqlalchemy import Engine

from probes.engine.spec import EngineSpec
from storage import queries as q
from storage.schemas import RunRow
from tests.support.injection import Request

# How long the scheduler stays paused once the run began: building the prompts, sending
# them, the API server queueing them (two spinning processes beside the suite spread a
# burst over 5 s).
HOLD_S = 10.0


def dev_mode(spec: EngineSpec) -> EngineSpec:
    """`spec` with vLLM's dev mode on, which only the owner's --allow-unsafe permits."""
    env = spec.env | {"VLLM_SERVER_DEV_MODE": "1"}
    return spec.model_copy(update={"env": env, "allow_unsafe": True})


def held_run(
    store: Engine,
    request: Request,
    base_url: str,
    params: dict[str, Any],
    api_key: str | None = None,
    hold_s: float = HOLD_S,
) -> RunRow:
    """A latency run (against the target `params` names) sent while the engine's scheduler is
    paused, keeping what arrives (`mode=keep`), and resumed `hold_s` after the run began."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    ended: list[RunRow] = []
    sender = threading.Thread(target=lambda: ended.append(request("latency", **params)))
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as engine:
        engine.post("/pause", params={"mode": "keep"}).raise_for_status()
        try:
            sender.start()
            _wait_running(store)
            time.sleep(hold_s)
        finally:
            engine.post("/resume").raise_for_status()
    sender.join()
    assert ended, "the burst's run did not end"
    return ended[0]


def _wait_running(store: Engine, timeout: float = 60.0) -> None:
    """Until the worker has taken the newest latency run."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = q.list_runs(store, kind="latency", limit=1)
        if runs and runs[0].status == "running":
            return
        time.sleep(0.2)
    raise AssertionError(f"the worker did not take the burst's run in {timeout} s")
