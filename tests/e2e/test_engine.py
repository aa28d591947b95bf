"""The managed engine for real: vLLM on CPU started from a spec, scraped, killed, adopted,
restarted with another model shape, and stopped without leaving a process behind."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from planner.errors import InvalidInput
from probes.engine import group_pids
from probes.engine.spec import EngineSpec, engine_tmp_dir, parse_spec, port_in_use, preflight
from probes.engine.venv.tinymodel import TinyParams
from storage import queries as q
from storage.settings import Settings
from tests.e2e.conftest import LiveWorker, engine_pids
from tests.support.cli import kvscope

pytestmark = pytest.mark.engine


def _wait(cond: object, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _plan(config: Path, spec: EngineSpec) -> dict[str, Any]:
    res = kvscope(
        "plan",
        "--model",
        str(config),
        "--gpu",
        "cpu",
        "--kv-memory-bytes",
        str(spec.kv_cache_memory_bytes),
        "--dtype",
        spec.dtype,
        "--block-size",
        str(spec.block_size),
        "--max-model-len",
        str(spec.max_model_len),
        "--json",
    )
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def _check_prediction(live: LiveWorker, name: str) -> None:
    """`kvscope plan` predicts exactly the blocks and tokens the running engine reports."""
    spec = live.worker.engines[name].spec
    assert spec.block_size and spec.max_model_len
    _wait(
        lambda: q.get_target(live.worker.store, name).num_gpu_blocks is not None,
        30,
        "cache_config_info scraped",
    )
    target = q.get_target(live.worker.store, name)
    plan = _plan(Path(spec.model) / "config.json", spec)
    assert plan["num_blocks"] == target.num_gpu_blocks
    assert plan["block_size"] == target.block_size
    assert plan["kv_capacity_tokens"] == plan["num_blocks"] * spec.block_size
    facts = live.worker.engines[name].state.facts
    _wait(lambda: "kv_capacity" in facts and "max_concurrency" in facts, 30, "startup facts")
    assert facts["max_concurrency"]["concurrency"] == round(plan["max_concurrency"], 2)
    # vLLM logs concurrency x max_model_len, which is not blocks x block size when the
    # length is not a multiple of the block size.
    blocks_per_seq = -(-spec.max_model_len // spec.block_size)
    logged = int(plan["num_blocks"] / blocks_per_seq * spec.max_model_len)
    assert facts["kv_capacity"]["tokens"] == logged


def test_engine_starts_from_its_spec_and_is_scraped(live: LiveWorker, cpu_engine: str) -> None:
    assert httpx.get(f"{cpu_engine}/health", timeout=5).status_code == 200
    _wait(lambda: q.get_target(live.worker.store, "embedded").health == "up", 30, "scraped up")
    target = q.get_target(live.worker.store, "embedded")
    assert target.managed and target.model_name == "tiny-llama"
    assert q.count_samples(live.worker.store, target.id) > 0
    kinds = {e.kind for e in q.events(live.worker.store, 0, time.time() + 1)}
    assert {
        "engine_starting",
        "engine_healthy",
        "engine_kv_capacity",
        "engine_max_concurrency",
    } <= kinds
    # Caches and temporary files stay inside the data directory.
    run_dir = live.settings.data_dir / "engines" / "embedded"
    assert (run_dir / "engine.log").stat().st_size > 0 and engine_tmp_dir(run_dir).is_dir()


def test_planner_predicts_what_the_live_engine_allocated(live: LiveWorker, cpu_engine: str) -> None:
    _check_prediction(live, "embedded")


def test_bad_specs_are_refused_and_nothing_starts(
    live: LiveWorker, cpu_engine: str, tmp_path: Path
) -> None:
    base = live.worker.engines["embedded"].spec.model_dump()
    with pytest.raises(InvalidInput, match="block_size 48 does not work on CPU"):
        parse_spec(base | {"block_size": 48})
    with pytest.raises(InvalidInput, match="needs kv_cache_memory_bytes"):
        parse_spec(base | {"kv_cache_memory_bytes": None})
    (tmp_path / "empty-model").mkdir()
    busy = parse_spec(base | {"name": "second", "model": str(tmp_path / "empty-model")})
    problems = preflight(busy)
    assert any("has no config.json" in p for p in problems)
    assert any(f"port {busy.port} on 127.0.0.1 is already in use" in p for p in problems)
    before = engine_pids(live)
    q.save_engine_spec(live.worker.store, busy.name, busy.model_dump())
    run = live.request("engine_start", name="second", timeout=60)
    assert run.status == "failed" and "not started" in (run.error or "")
    assert "has no config.json" in (run.error or "")
    assert engine_pids(live) == before  # the running engine is untouched, nothing new ran
    assert not (live.settings.data_dir / "engines" / "second" / "engine.pid").exists()
    q.set_desired_state(live.worker.store, "second", "stopped")


def test_a_restarted_worker_adopts_the_running_engine(live: LiveWorker, cpu_engine: str) -> None:
    pids = engine_pids(live)
    live.stop(keep_engines=True)  # the worker dies; its engine keeps running
    assert engine_pids(live) == pids
    live.replace()
    _wait(lambda: live.worker.engines["embedded"].state.status == "running", 60, "adopted")
    assert sorted(group_pids(live.worker.engines["embedded"].state.pid or 0)) == sorted(pids)
    adopted = q.events(live.worker.store, 0, time.time() + 1, kinds=["engine_adopted"])
    assert len(adopted) == 1
    assert httpx.get(f"{cpu_engine}/health", timeout=5).status_code == 200


@pytest.mark.engine_last  # it leaves another model running: the probes' tests come first
def test_restart_applies_a_changed_spec(
    live: LiveWorker, cpu_engine: str, e2e_settings: Settings
) -> None:
    """A second tiny shape (3 layers, 1 KV head of 64, bf16, block 64): the planner again."""
    from probes.engine.spec import build_tiny_model

    other = build_tiny_model(
        e2e_settings,
        e2e_settings.data_dir / "models" / "tiny-b",
        TinyParams(layers=3, hidden=128, heads=4, kv_heads=1, head_dim=64, dtype="bfloat16"),
    )
    spec = live.worker.engines["embedded"].spec.model_copy(
        update={
            "model": str(other),
            "dtype": "auto",
            "block_size": 64,
            "kv_cache_memory_bytes": 12 * 1024 * 1024,
            "max_model_len": 4000,
        }
    )
    q.save_engine_spec(live.worker.store, "embedded", spec.model_dump())
    run = live.request("engine_restart", name="embedded", timeout=600)
    assert run.status == "done", run.error
    _wait(
        lambda: q.get_target(live.worker.store, "embedded").block_size == 64,
        60,
        "new cache config scraped",
    )
    _check_prediction(live, "embedded")


@pytest.mark.engine_last
def test_kill_9_is_detected_and_the_engine_comes_back(live: LiveWorker, cpu_engine: str) -> None:
    manager = live.worker.engines["embedded"]
    old = manager.state.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    _wait(
        lambda: manager.state.status == "running" and manager.state.pid != old,
        300,
        "restart after kill -9",
    )
    tid = q.get_target(live.worker.store, "embedded").id
    crash = q.events(live.worker.store, 0, time.time() + 1, tid, kinds=["engine_crashed"])
    assert len(crash) == 1 and crash[0].data["exit_code"] == -signal.SIGKILL
    assert crash[0].data["last_lines"], "a crash event carries the engine's last log lines"
    assert not group_pids(old), "the killed engine's children were cleaned up"
    _wait(lambda: q.get_target(live.worker.store, "embedded").health == "up", 60, "scraped")


@pytest.mark.engine_last
def test_stop_leaves_no_process_behind(live: LiveWorker, cpu_engine: str) -> None:
    manager = live.worker.engines["embedded"]
    pid = manager.state.pid
    assert pid is not None and group_pids(pid)
    run = live.request("engine_stop", name="embedded", timeout=120)
    assert run.status == "done", run.error
    assert group_pids(pid) == []
    assert not port_in_use("127.0.0.1", manager.spec.port)
    run_dir = live.settings.data_dir / "engines" / "embedded"
    assert not (run_dir / "engine.pid").exists() and not engine_tmp_dir(run_dir).exists()
    time.sleep(5)  # the supervisor must not bring a stopped engine back
    assert manager.state.status == "stopped" and not group_pids(pid)
