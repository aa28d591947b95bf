"""`kvscope simulate`: the latency probe's JSON shape, a rate sweep, and one-line refusals."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

import app.cli
from planner.errors import KvscopeError
from planner.simulate.calibrate import fit
from planner.simulate.whatif import traffic
from planner.workload import Arrival
from probes.kinds.calibration import save as save_calibration
from storage import queries as q
from tests.planner.test_calibrate import CONFIG, samples
from tests.support.cli import kvscope

BASE = ("simulate", "-m", "llama-3.1-8b", "-g", "l4", "--set", "max_model_len=8192")


def run_json(*args: str) -> dict[str, Any]:
    result = kvscope(*BASE, *args, "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_one_rate_prints_the_latency_probes_shape_and_the_highest_rate() -> None:
    doc = run_json(
        "--rate", "2", "--profile", "chat", "--set", "num_requests=300",
        "--slo-ttft", "0.5", "--slo-tpot", "0.1",
    )  # fmt: skip
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"):
        assert set(doc[key]) >= {"p50", "p95", "p99"}
        assert 0 < doc[key]["p50"] <= doc[key]["p99"] or key == "queue_s"
    assert doc["source"] == "roofline" and doc["requests"] == 300
    assert "measured on an H200" in doc["source_error"]  # the roofline's error, where known
    assert isinstance(doc["preemptions"], int) and doc["max_rate"] > 0
    assert doc["slo_share"] is not None and doc["kv_blocks"] > 0
    # The TPOT the capacity probe re-aims by: at the highest rate, inside the SLO's bound.
    assert 0 < doc["tpot_p50_at_max_rate"] <= 0.1


def test_a_sweep_gives_a_curve_whose_tail_rises() -> None:
    doc = run_json(
        "--sweep-rate", "1:9:3", "--set", "num_requests=300", "--set", "output_tokens=64"
    )
    rates = [p["rate"] for p in doc["points"]]
    assert rates == [1.0, 5.0, 9.0]
    p99 = [p["ttft_s"]["p99"] for p in doc["points"]]
    assert p99[0] < p99[-1] and doc["max_rate"] is None
    assert doc["tpot_p50_at_max_rate"] is None


def test_seconds_of_arrivals_instead_of_a_count() -> None:
    doc = run_json("--rate", "4", "--set", "duration_s=25", "--set", "output_tokens=16")
    assert doc["requests"] == 100  # 4 a second for 25 s, as the latency probe's duration_s


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--rate", "1", "--set", "colour=red"), "unknown setting 'colour'"),
        (("--rate", "1", "--set", "max_num_seqs=lots"), "max_num_seqs"),
        (("--rate", "0"), "above 0"),
        (("--sweep-rate", "1,x"), "cannot read '1,x' as rates"),
        ((), "--rate R or --sweep-rate"),
        (("--rate", "1", "--slo-ttft", "0.5"), "--slo-tpot"),
        (("--rate", "1", "--profile", "{bad"), "not valid JSON"),
        (("--rate", "1", "--profile", "nope"), "nope"),
        (("--rate", "1", "--set", "duration_s=9", "--set", "num_requests=5"), "or duration_s"),
    ],
)
def test_bad_input_is_refused_by_name(args: tuple[str, ...], message: str) -> None:
    result = CliRunner().invoke(app.cli.app, [*BASE, *args])
    assert isinstance(result.exception, KvscopeError), result.output
    assert message in str(result.exception)


def test_a_refusal_is_one_line_and_exit_2() -> None:
    result = kvscope(*BASE, "--rate", "1", "--set", "colour=red")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_a_calibrated_target_is_simulated_with_its_fitted_cost(
    store: Engine, tmp_path: Path
) -> None:
    q.add_target(store, q.parse_target({"name": "cpu", "base_url": "http://127.0.0.1:1"}))
    missing = kvscope("simulate", "--target", "cpu", "--rate", "1", env_dir=tmp_path)
    assert missing.returncode == 2 and "kvscope simulate calibrate --target cpu" in missing.stderr
    decodes, prefills = samples(noise=0.05)
    cal = fit(decodes, prefills, CONFIG).model_copy(
        update={"target": "cpu", "fitted_at": time.time() - 3 * 3600}
    )
    save_calibration(store, "cpu", cal)
    args = ("simulate", "--target", "cpu", "--rate", "2", "--set", "num_requests=200")
    res = kvscope(*args, "--set", "max_num_seqs=4", "--json", env_dir=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["source"].startswith("calibrated on cpu from 10 measurements")
    assert doc["source"].endswith("; fitted 3 h ago")  # a prediction says how old its fit is
    assert doc["source_error"] == cal.fit_error() and "fit error" in doc["source_error"]
    assert "kvscope simulate calibrate --target cpu --retune" in res.stderr
    assert doc["kv_blocks"] == CONFIG.num_blocks and doc["ttft_s"]["p50"] > cal.api_s
    refused = kvscope(*args, "--set", "kv_cache_dtype=fp8", env_dir=tmp_path)
    assert refused.returncode == 2 and "kv_cache_dtype cannot change" in refused.stderr
    both = kvscope(*args, "-m", "llama-3.1-8b", "-g", "l4", env_dir=tmp_path)
    assert both.returncode == 2 and "--target" in both.stderr
    for retune in ((), ("--retune",)):
        unmanaged = kvscope("simulate", "calibrate", "--target", "cpu", *retune, env_dir=tmp_path)
        assert unmanaged.returncode == 2 and "not an engine kvscope manages" in unmanaged.stderr


def test_a_check_replays_the_newest_latency_run_since_the_tune_and_keeps_its_drift(
    store: Engine, tmp_path: Path
) -> None:
    from tests.probes.test_calibration_flow import PROFILE, FakeEngine

    target = q.add_target(store, q.parse_target({"name": "cpu", "base_url": "http://127.0.0.1:1"}))
    decodes, prefills = samples(noise=0.0)
    cal = fit(decodes, prefills, CONFIG).model_copy(
        update={"target": "cpu", "fitted_at": time.time() - 60, "tuned_at": time.time() - 60}
    )
    save_calibration(store, "cpu", cal)
    none = kvscope("simulate", "check", "--target", "cpu", env_dir=tmp_path)
    assert none.returncode == 2 and "kvscope probe latency --target cpu" in none.stderr
    engine = FakeEngine(store)
    arrivals = list(traffic(PROFILE, Arrival(rate=3.0), 90))
    ids = []
    for slow in (1.4, 1.2):  # (the newer run the slower one's successor)
        run = q.request_run(store, "latency", {"rate": 3.0}, target_id=target.id)
        ttft, tpot = engine.store_requests(run.id, arrivals, slow=slow)
        summary = {"ttft_s": {"p50": ttft}, "tpot_s": tpot}
        q.update_run(store, run.id, status="done", summary=summary, started_at=time.time())
        ids.append(run.id)
    checks = []
    for _ in ids:
        res = kvscope("simulate", "check", "--target", "cpu", "--json", env_dir=tmp_path)
        assert res.returncode == 0, res.stderr
        checks.append(json.loads(res.stdout))
    # The newest first, then the one before it; each kept with the calibration.
    assert [c["run"] for c in checks] == [f"latency run {i}" for i in reversed(ids)]
    assert checks[0]["drift"] == pytest.approx(1.2, rel=0.08)
    assert checks[1]["drift"] == pytest.approx(1.4, rel=0.08)
    again = kvscope("simulate", "check", "--target", "cpu", "--run", str(ids[0]), env_dir=tmp_path)
    assert again.returncode == 2 and "was checked already" in again.stderr
    res = kvscope("simulate", "--target", "cpu", "--rate", "2", "--json", env_dir=tmp_path)
    doc = json.loads(res.stdout)
    assert "2 later runs replayed at this cost ran their steps x1." in doc["source_error"]
