"""Chart builders for probe results: plain functions from a run's summary (or its request
records) to Plotly figures, tested without Streamlit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from app.charts.timeseries import PALETTE, right_axis


def _base(fig: go.Figure, title: str, x: str, y: str, height: int = 320) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.0, "font": {"size": 15}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        template="plotly_white",
        legend={"orientation": "h", "y": 1.0, "x": 1.0, "xanchor": "right", "yanchor": "bottom"},
        xaxis_title=x,
        yaxis_title=y,
    )
    return fig


def cdf_chart(series: Mapping[str, Sequence[float]], title: str, unit: str = "s") -> go.Figure:
    """Empirical CDFs: the share of requests at or below each value."""
    fig = go.Figure()
    for i, (label, values) in enumerate(series.items()):
        xs = np.sort(np.asarray([v for v in values if v is not None and np.isfinite(v)]))
        if xs.size == 0:
            continue
        ys = np.arange(1, xs.size + 1) / xs.size
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                name=label,
                mode="lines",
                line={"shape": "hv", "color": PALETTE[i % len(PALETTE)]},
            )
        )
    for q in (0.5, 0.99):
        fig.add_hline(
            y=q, line={"dash": "dot", "color": "#9ca3af"}, annotation_text=f"p{round(q * 100)}"
        )
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    return _base(fig, title, unit, "share of requests")


def sweep_chart(steps: Sequence[Mapping[str, Any]], knee: int | None) -> go.Figure:
    """Throughput and latency against concurrency, the knee marked."""
    c = [s["concurrency"] for s in steps]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=c,
            y=[s["output_tokens_per_s"] for s in steps],
            mode="lines+markers",
            name="output tokens/s",
            line={"color": PALETTE[0]},
        )
    )
    for key, color in (("p50", PALETTE[1]), ("p99", PALETTE[2])):
        fig.add_trace(
            go.Scatter(
                x=c,
                y=[s["e2e_s"][key] for s in steps],
                mode="lines+markers",
                name=f"E2E {key} (s)",
                yaxis="y2",
                line={"color": color, "dash": "dot"},
            )
        )
    if knee is not None:
        fig.add_vline(
            x=knee, line={"color": "#dc2626", "dash": "dash"}, annotation_text=f"knee: {knee}"
        )
    fig.update_layout(
        xaxis={"type": "log", "tickvals": c},
        yaxis={"rangemode": "tozero"},
        yaxis2=right_axis("E2E latency (s)"),
    )
    return _base(fig, "Throughput against latency", "concurrency", "output tokens/s")


def oom_chart(
    steps: Sequence[Mapping[str, Any]],
    failure: Mapping[str, Any] | None,
    predicted: Mapping[str, Any] | None,
) -> go.Figure:
    """Peak KV usage and E2E per context step; the failure and the planner's frontier."""
    ok = [s for s in steps if s["outcome"] == "ok"]
    bad = [s for s in steps if s["outcome"] != "ok"]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[s["context"] for s in steps],
            y=[s["kv_usage_peak"] for s in steps],
            mode="lines",
            name="peak KV usage",
            line={"color": PALETTE[0]},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[s["context"] for s in ok],
            y=[s["kv_usage_peak"] for s in ok],
            mode="markers",
            name="all sequences ran",
            marker={"color": PALETTE[3], "size": 9},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[s["context"] for s in bad],
            y=[s["kv_usage_peak"] or 0 for s in bad],
            mode="markers",
            name="limit: " + ", ".join(sorted({s["outcome"] for s in bad})),
            text=[s["why"] for s in bad],
            marker={"color": PALETTE[2], "size": 13, "symbol": "x"},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[s["context"] for s in steps],
            y=[s["e2e_p50_s"] for s in steps],
            mode="lines",
            name="E2E p50 (s)",
            yaxis="y2",
            line={"color": PALETTE[1], "dash": "dot"},
        )
    )
    if failure is not None:
        fig.add_vline(
            x=failure["context"],
            line={"color": PALETTE[2], "dash": "dash"},
            annotation_text=f"measured: {failure['kind']}",
        )
    if predicted is not None:
        fig.add_vline(
            x=predicted["context"],
            line={"color": "#6b7280", "dash": "dot"},
            annotation_text="planner",
            annotation_position="bottom right",
        )
    fig.update_layout(
        yaxis={"range": [0, 1.05], "tickformat": ".0%"},
        yaxis2=right_axis("E2E p50 (s)"),
    )
    return _base(fig, "Context steps and the OOM frontier", "tokens per sequence", "peak KV usage")


def kv_timeline_chart(
    timeline: Sequence[Mapping[str, Any]], load_window: Sequence[float] | None
) -> go.Figure:
    """KV usage (free blocks on hover) with cumulative preemptions; the load window shaded."""
    t = [p["t"] for p in timeline]
    pre = [p.get("preemptions_total") for p in timeline]
    first = next((p for p in pre if p is not None), 0.0)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=t,
            y=[p.get("kv_usage") for p in timeline],
            customdata=[p.get("free_blocks") for p in timeline],
            hovertemplate="%{y:.1%} used, %{customdata} blocks free<extra></extra>",
            mode="lines",
            name="KV usage",
            line={"color": PALETTE[0], "shape": "hv"},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=t,
            y=[None if p is None else p - first for p in pre],
            mode="lines",
            name="preemptions",
            yaxis="y2",
            line={"color": PALETTE[2], "shape": "hv", "dash": "dot"},
        )
    )
    if load_window:
        fig.add_vrect(
            x0=load_window[0],
            x1=load_window[1],
            fillcolor="#dbeafe",
            opacity=0.4,
            line_width=0,
            annotation_text="load",
        )
    fig.update_layout(
        yaxis={"range": [0, 1.05], "tickformat": ".0%"},
        yaxis2=right_axis("preemptions"),
    )
    return _base(fig, "KV usage during the probe", "seconds", "KV usage")


def capacity_chart(steps: Sequence[Mapping[str, Any]], share: float) -> go.Figure:
    """Share of requests inside the SLO at each rate tried, the required share marked."""
    ordered = sorted(steps, key=lambda s: s["rate"])
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[s["rate"] for s in ordered],
            y=[s["slo_share"] for s in ordered],
            mode="lines+markers",
            name="inside the SLO",
            marker={
                "color": [PALETTE[3] if s["passed"] else PALETTE[2] for s in ordered],
                "size": 10,
            },
        )
    )
    fig.add_hline(
        y=share, line={"dash": "dash", "color": "#dc2626"}, annotation_text=f"required {share:.0%}"
    )
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    return _base(fig, "SLO compliance against request rate", "requests/s", "share inside SLO")
