"""The What-if page under AppTest, and its chart builders without Streamlit."""

from __future__ import annotations

import time
from typing import Any

import pytest
import streamlit as st
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from app.charts import whatif as charts
from planner.simulate import EngineConfig, StepCost
from planner.simulate.calibrate import Check, fit
from planner.simulate.whatif import Scenario, sweep
from planner.workload import get_profile
from probes.kinds.calibration import save as save_calibration
from storage.settings import Settings
from tests.planner.test_calibrate import CONFIG, samples


@pytest.fixture(autouse=True)
def _own_store(settings: Settings) -> None:
    """The page reads stored calibrations: from a store of the test's own."""


def _page() -> None:
    from app.common import error_boundary
    from app.views.whatif import render

    error_boundary(render)()  # as app/main.py renders every page


def _run(**choices: Any) -> AppTest:
    at = AppTest.from_function(_page, default_timeout=120)
    at.run()
    for key, value in choices.items():
        widgets = [w for w in at.selectbox if w.key == f"whatif_{key}"]
        widget = widgets[0] if widgets else at.number_input(key=f"whatif_{key}")
        widget.set_value(value)
        at.run()
    return at


def test_the_default_page_predicts_a_curve_its_highest_rate_and_its_source() -> None:
    at = _run(requests=300, count=4)
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == 2 and len(at.dataframe) == 1
    (best,) = [m for m in at.metric if m.label.startswith("Highest rate")]
    assert best.value.endswith("req/s") and best.proto.help
    assert any("roofline" in c.value and "uncalibrated" in c.value for c in at.caption)
    assert "kvscope simulate -m llama-3.1-8b -g h100-sxm" in at.code[0].value


def test_a_second_setting_sits_beside_the_first() -> None:
    at = _run(
        requests=300, count=3, variant="FP8 KV cache", model="llama-3.1-8b", gpu="NVIDIA L4 24GB"
    )
    assert not at.exception and not at.error
    labels = sorted(m.label for m in at.metric)
    assert labels == [
        "Highest rate meeting the SLO (FP8 KV cache)",
        "Highest rate meeting the SLO (as set)",
    ]
    assert len(at.dataframe[0].value) == 6  # three rates for each setting


def test_the_tail_chart_draws_p50_p99_the_band_and_the_slo() -> None:
    config = EngineConfig(num_blocks=4096, max_num_seqs=64, max_num_batched_tokens=2048)
    cost = StepCost(0.002, 0.010, 2e-7, 2e-5)
    points = sweep(Scenario(config, cost, get_profile("chat"), 200), [1.0, 5.0], seeds=9)
    fig = charts.tail_figure({"a": points}, slo_ttft_s=0.5)
    names = [t.name for t in fig.data]
    assert names == ["a: p99 80% band", "a: TTFT p99", "a: TTFT p50"]
    assert fig.layout.shapes[0].y0 == 500  # the SLO line, in ms
    kv = charts.kv_figure({"a": points[0].prediction})
    assert max(kv.data[0].y) <= 100 and len(kv.data) == 2


def test_a_stored_calibration_is_a_step_cost_to_choose(store: Engine) -> None:
    decodes, prefills = samples(noise=0.05)
    tuned = time.time() - 2 * 3600
    cal = fit(decodes, prefills, CONFIG).model_copy(
        update={"target": "cpu", "fitted_at": tuned, "tuned_at": tuned}
    )
    save_calibration(store, "cpu", cal)
    at = _run(requests=200, count=3, low=5.0, high=40.0)
    at.selectbox(key="whatif_source").set_value("calibrated on cpu")
    at.run()
    assert not at.exception and not at.error
    assert any(c.value.startswith("Step cost: calibrated on cpu") for c in at.caption)
    assert any("fitted 2 h ago" in c.value for c in at.caption)
    # Two hours on, the page says how to measure the load's speed again.
    assert any("--target cpu --retune" in i.value for i in at.info)
    assert "kvscope simulate --target cpu" in at.code[0].value
    # Its dtype was measured: FP8 KV is not offered beside it.
    assert "FP8 KV cache" not in at.selectbox(key="whatif_variant").options
    assert not at.expander or all("Later runs checked" not in e.label for e in at.expander)
    # Runs checked since: each listed, newest first, and the source says how far they ran.
    noisy, quiet = [(0.02, 0.03)] * 50, [(0.001, 0.002)] * 50
    runs = [(1.05, [], True), (0.92, noisy, False), (1.18, quiet, None)]
    ran = [Check(at=tuned + 60 * i, drift=d, run=f"latency run {i}", noise=noise, queued=full)
           for i, (d, noise, full) in enumerate(runs)]  # fmt: skip
    save_calibration(store, "cpu", cal.model_copy(update={"checks": ran}))
    st.cache_data.clear()  # (the page keeps its calibrations 10 s)
    at.run()
    assert not at.exception
    (listed,) = [e for e in at.expander if e.label == "Later runs checked against it (3)"]
    assert list(listed.dataframe[0].value["run"]) == ["latency run 2", "latency run 1",
                                                      "latency run 0"]  # fmt: skip
    stalls = list(listed.dataframe[0].value["stalls, TTFT p99 (ms)"])
    assert stalls[:2] == [1.0, 20.0] and stalls[2] != stalls[2]  # (NaN: none kept, it queued)
    queued = list(listed.dataframe[0].value["queued"])
    assert queued[0] != queued[0] and queued[1:] == ["no", "yes"]  # (NaN: stored before)
    assert any("ran their steps x0.92 to x1.18 as long" in c.value for c in at.caption)
