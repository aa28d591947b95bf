"""Chart builders are plain functions: right traces, right axes, no Streamlit needed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from app.charts import timeseries as charts


def _frame() -> pd.DataFrame:
    ts = 1_800_000_000 + np.arange(5) * 60.0
    return pd.DataFrame(
        {
            "kv_usage": [0.1, 0.2, np.nan, 0.4, 0.5],
            "free_blocks": [900, 800, np.nan, 600, 500],
            "p50": [0.1] * 5,
            "p95": [0.2] * 5,
            "p99": [0.4] * 5,
            "ratio": [4.0] * 5,
        },
        index=ts,
    )


def test_timeseries_with_secondary_axis_and_percent() -> None:
    fig = charts.timeseries(
        _frame(),
        {"kv_usage": "KV usage"},
        "KV",
        "used",
        percent=True,
        secondary={"free_blocks": "free blocks"},
    )
    assert [t.name for t in fig.data] == ["KV usage", "free blocks"]
    assert fig.data[1].yaxis == "y2" and fig.layout.yaxis.tickformat == ".0%"
    assert fig.data[0].line.shape == "hv"  # a stored value holds until the next one
    assert str(pd.Timestamp(fig.data[0].x[0])).startswith("2027-01-15 08:00:00")


def test_missing_columns_are_skipped() -> None:
    fig = charts.timeseries(_frame(), {"nope": "x", "kv_usage": "y"}, "t", "u")
    assert [t.name for t in fig.data] == ["y"]


def test_quantile_and_ratio_charts() -> None:
    q = charts.quantile_chart(_frame(), "ttft")
    assert [t.name for t in q.data] == ["p50", "p95", "p99"]
    assert "Time to first token" in q.layout.title.text
    r = charts.ratio_chart({"ttft": _frame(), "itl": _frame()}, alert_at=3.0)
    assert [t.name for t in r.data] == ["TTFT", "ITL"] and len(r.layout.shapes) == 1
