"""The Planner page under AppTest, and its chart builders without Streamlit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from app.charts import planner as charts
from storage.settings import Settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _page() -> None:
    from app.common import error_boundary
    from app.views.planner import render

    error_boundary(render)()  # as app/main.py renders every page


def _run(**choices: Any) -> AppTest:
    at = AppTest.from_function(_page, default_timeout=60)
    at.run()
    for key, value in choices.items():
        widget = (
            at.selectbox(key=f"planner_{key}")
            if key in SELECTS
            else at.number_input(key=f"planner_{key}")
        )
        widget.set_value(value)
        at.run()
    return at


SELECTS = {"model", "gpu", "kv", "weights", "dtype", "block"}


def metric(at: AppTest, label: str) -> str:
    values = [m.value for m in at.metric if m.label == label]
    assert values, [m.label for m in at.metric]
    return str(values[0])


def test_default_page_renders_every_section() -> None:
    at = _run()
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == 6  # memory, curve, fits map, attention, frag, compare
    assert metric(at, "KV bytes per token") == "131,072"
    assert metric(at, "Parameters") == "8.03 B"
    assert metric(at, "Batch of 16") == "fits"
    # Every metric explains itself.
    assert all(m.proto.help for m in at.metric)
    assert len(at.caption) >= 6
    assert len(at.dataframe) == 1


def test_mla_model_on_eight_gpus() -> None:
    at = _run(model="deepseek-v3", gpu="NVIDIA H200 SXM 141GB", num_gpus=8)
    assert not at.exception and not at.error
    assert metric(at, "KV bytes per token") == "70,272"
    assert metric(at, "Parameters") == "671.03 B"
    assert str(at.selectbox(key="planner_block_deepseek-v3").value) == "64"
    assert "int8" not in at.selectbox(key="planner_kv_deepseek-v3").options


def test_bad_tensor_parallel_shows_an_error() -> None:
    at = _run(model="llama-2-13b", num_gpus=3)
    assert not at.exception
    assert len(at.error) == 1
    assert "valid tp sizes: 1, 2, 4, 5, 8, 10, 20, 40" in at.error[0].value


def test_model_that_does_not_fit_warns() -> None:
    at = _run(model="llama-3.1-70b", gpu="NVIDIA A100 80GB SXM")
    assert not at.exception
    assert metric(at, "Batch of 16") == "OOM"
    assert any("No available memory" in w.value for w in at.warning)


def test_custom_gpu_and_upload_choices() -> None:
    at = _run(gpu="Custom (memory in GiB)")
    assert not at.exception and not at.error
    at.number_input(key="planner_custom_gib").set_value(24.0)
    at.run()
    assert not at.exception
    at.selectbox(key="planner_model").set_value("Upload a config.json…")
    at.run()
    assert not at.exception and not at.error
    assert any("Upload" in i.value for i in at.info)


def test_a_managed_engines_startup_log_against_the_plan(settings: Settings) -> None:
    log = FIXTURES / "vllm_startup_logs" / "h100-0.19.0-qwen2.5-72b-tp2.log"
    run_dir = settings.data_dir / "engines" / "big"
    run_dir.mkdir(parents=True)
    (run_dir / "engine.log").write_text(log.read_text())
    choices = {"context_qwen2.5-72b": 4096}
    at = _run(model="qwen2.5-72b", gpu="NVIDIA H100 SXM 80GB", num_gpus=2, **choices)
    assert not at.exception and not at.error
    at.radio(key="planner_log_src").set_value("Managed engine big")
    at.run()
    assert not at.exception and not at.error
    frames = [d.value for d in at.dataframe]
    (lines,) = [f for f in frames if "measured" in f.columns]
    kv = lines[lines[""] == "KV tokens"].iloc[0]
    assert kv["measured"] == 19_920 and abs(kv["predicted"] / 19_920 - 1) < 0.05
    (replans,) = [f for f in frames if "KV dtype" in f.columns]
    assert list(replans["KV dtype"]) == ["auto", "fp8"] and list(replans["context"]) == [4096] * 2
    assert any("accounting v0.17" in c.value for c in at.caption)


def test_the_release_picks_the_accounting() -> None:
    at = _run(gpu="NVIDIA H100 SXM 80GB")
    assert any("up to" in str(m.proto.delta) for m in at.metric)  # the newest: a range
    at.selectbox(key="planner_release").set_value("0.19")
    at.run()
    assert not at.exception and not at.error
    assert metric(at, "KV capacity (tokens)")  # one number: no "low end" label
    assert any("accounting v0.17" in c.value for c in at.caption)


# --- chart builders ---------------------------------------------------------------------


def test_memory_breakdown_skips_empty_parts() -> None:
    fig = charts.memory_breakdown_figure(
        {"weights": 1 << 30, "kv_cache": 3 << 30, "cuda_graphs": 0}
    )
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == ["weights", "kv cache"]
    assert fig.data[1].x[0] == pytest.approx(3.0)


def test_concurrency_and_fits_map_figures() -> None:
    contexts = np.array([1024, 2048, 4096])
    fig = charts.concurrency_figure(
        contexts, {"bfloat16": [8, 4, 2], "fp8": [16, 8, 4]}, marker=(2048, 4.0)
    )
    assert [t.name for t in fig.data] == ["bfloat16", "fp8", "this plan"]
    grid = np.array([[True, True, False], [True, False, False]])
    fmap = charts.fits_map_figure(contexts, [1, 2], grid, {"bfloat16": [2048, 1024]})
    assert fmap.data[0].type == "heatmap" and fmap.data[1].name == "OOM frontier, bfloat16"
    assert np.asarray(fmap.data[0].z).tolist() == [[1, 1, 0], [1, 0, 0]]


def test_attention_fragmentation_and_comparison_figures() -> None:
    fig = charts.attention_figure(["MHA", "GQA"], [819_200, 163_840], [10, 50])
    assert len(fig.data) == 2 and fig.data[0].text[0] == "800.0 KiB"
    frag = charts.fragmentation_figure(0.7, 0.01)
    assert list(frag.data[0].y) == pytest.approx([70.0, 1.0])
    cmp = charts.comparison_figure(["a", "b"], [1, 2], "t")
    assert cmp.layout.title.text == "t"
