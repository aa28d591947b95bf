"""A token-protected engine, as `vllm serve --api-key` runs it: the session's own engine
demands `API_KEY` on its /v1 routes. Attached by name with its token variable, it is scraped
and probed (the token on every request); a probe without the token fails with one line."""

from __future__ import annotations

import json

import pytest

from storage import queries as q
from storage.settings import Settings
from tests.e2e.conftest import API_KEY, LiveWorker
from tests.support.cli import kvscope
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine


def test_a_guarded_engine_is_scraped_and_probed_by_name_with_its_token(
    live: LiveWorker, cpu_engine: str, e2e_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_TOKEN_E2E", API_KEY)  # the worker runs in this process
    store = live.worker.store
    data = {"name": "guarded", "base_url": cpu_engine, "token_env": "KVSCOPE_TOKEN_E2E"}
    q.add_target(store, q.parse_target(data))
    try:
        wait_until(lambda: q.get_target(store, "guarded").health == "up", 60, "guarded up")
        assert q.get_target(store, "guarded").health == "up"

        args = ("--rate", "2", "--duration", "4", "--prompt-tokens", "32", "--output-tokens", "8")
        ok = kvscope(
            "probe", "latency", "--target", "guarded", *args, "--json",
            env_dir=e2e_settings.data_dir, environ={"KVSCOPE_TOKEN_E2E": API_KEY}, timeout=300,
        )  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        out = json.loads(ok.stdout)
        assert out["requests"] > 0 and out["ok"] == out["requests"] and out["errors"] == 0

        refused = kvscope(
            "probe", "latency", "--target", cpu_engine, *args,
            env_dir=e2e_settings.data_dir, timeout=120,
        )  # fmt: skip
        assert refused.returncode == 2
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and "401: the engine wants a token" in last

        run = live.request(
            "latency", target="guarded", rate=2, duration_s=3, prompt_tokens=32, output_tokens=8
        )
        assert run.status == "done", run.error
        assert run.summary["errors"] == 0 and run.summary["ok"] == run.summary["requests"]
    finally:
        q.remove_target(store, "guarded")
