"""The latency probe, its runner and its CLI against the loopback OpenAI stand-in."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from planner.errors import InvalidInput, UnknownChoice
from probes.runner import StoredRun, execute, parse_params
from storage import queries as q
from storage.tables import RequestRecord
from tests.support.cli import kvscope
from tests.support.fake_openai import FakeConfig, serve


def test_latency_summary_from_the_schedule() -> None:
    params = parse_params(
        "latency",
        {
            "rate": 50,
            "duration_s": 1,
            "prompt_tokens": 32,
            "output_tokens": 8,
            "arrival": "constant",
            "ttft_slo_s": 0.5,
            "tpot_slo_s": 0.1,
            "lateness_limit_s": 0.1,  # lateness has its own tests; a shared box hiccups
        },
    )
    with serve(FakeConfig(ttft_s=0.02, itl_s=0.002)) as fake:
        out = asyncio.run(execute("latency", params, fake.url))
    assert out["model"] == "tiny-llama"  # discovered from /v1/models
    assert out["requests"] == 50 and out["errors"] == 0 and out["ok"] == 50
    assert out["ttft_s"]["p50"] >= 0.02  # counted from the schedule: never below the delay
    assert out["tpot_s"]["p50"] == pytest.approx(0.002, abs=0.002)
    assert out["slo_share"] == 1.0 and out["trustworthy"] is True
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        assert set(out[key]) == {"p50", "p95", "p99", "mean"}
    assert set(out["lateness_s"]) == {"p50", "p99", "max"}
    assert out["requests_per_s"] > 0 and out["output_tokens_per_s"] > 0
    assert "engine" not in out  # the stand-in has no /metrics: the client's view only


def test_bad_parameters_are_refused_with_their_names() -> None:
    with pytest.raises(InvalidInput, match="rate"):
        parse_params("latency", {"rate": -1})
    with pytest.raises(InvalidInput, match="bogus"):
        parse_params("latency", {"bogus": 1})
    with pytest.raises(InvalidInput, match="profile or prompt/output"):
        parse_params("latency", {"profile": "chat", "prompt_tokens": 10})
    with pytest.raises(UnknownChoice, match="valid choices: batch_sweep, capacity, kv_usage, lat"):
        parse_params("nope", {})


def test_a_stored_run_keeps_records_progress_and_honours_cancel(store: Engine) -> None:
    params = parse_params(
        "latency", {"rate": 20, "duration_s": 30, "prompt_tokens": 16, "output_tokens": 4}
    )
    run = q.start_run(store, "latency", params.model_dump())
    stored = StoredRun(store, run.id)
    with serve(FakeConfig(itl_s=0.001)) as fake:
        asyncio.get_event_loop_policy()
        import threading

        threading.Timer(2.0, lambda: q.cancel_run(store, run.id)).start()
        out = stored.run("latency", params, fake.url)
    assert out["cancelled"] is True and out["stopped"] == "cancelled"
    with store.connect() as conn:
        n = conn.execute(
            select(func.count()).select_from(RequestRecord).where(RequestRecord.run_id == run.id)
        ).scalar_one()
    assert 20 <= n < 600  # stopped after a couple of seconds, not after 30
    assert q.get_run(store, run.id).progress > 0


def test_cli_prints_one_json_object(tmp_path: Path) -> None:
    with serve(FakeConfig(ttft_s=0.005)) as fake:
        res = kvscope(
            "probe",
            "latency",
            "--target",
            fake.url,
            "--rate",
            "20",
            "--duration",
            "1",
            "--prompt-tokens",
            "16",
            "--output-tokens",
            "4",
            "--arrival",
            "constant",
            "--json",
            env_dir=tmp_path,
            timeout=120,
        )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    for key in (
        "requests",
        "errors",
        "ttft_s",
        "itl_s",
        "tpot_s",
        "e2e_s",
        "lateness_s",
        "output_tokens_per_s",
        "requests_per_s",
    ):
        assert key in out
    assert out["requests"] == 20 and out["ttft_s"]["p50"] >= 0.005
    assert "%" in res.stderr  # the progress bar
    from storage.db import open_store

    runs = q.list_runs(open_store(f"sqlite:///{tmp_path / 'kvscope.db'}"))
    assert [(r.kind, r.status) for r in runs] == [("latency", "done")]


def test_cli_refuses_an_unreachable_target_with_one_line(tmp_path: Path) -> None:
    res = kvscope(
        "probe", "latency", "--target", "http://127.0.0.1:9", "--duration", "1", env_dir=tmp_path
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error: cannot reach")


def test_a_stored_profile_is_used_by_name() -> None:
    stored = {"mine": {"kind": "fixed", "prompt_tokens": 7, "output_tokens": 3}}
    params = parse_params("latency", {"profile": "mine", "schedule_id": 4}, stored)
    assert params.workload().shapes(1)[0].prompt_tokens == 7  # type: ignore[attr-defined]
    with pytest.raises(UnknownChoice, match="workload profile 'other'"):
        parse_params("latency", {"profile": "other"}, stored).workload()  # type: ignore[attr-defined]
