"""Probe charts: the one renderer of a probe kind's `Chart`, and CDFs of request records.

A kind declares its chart as data (`probes.kinds.chart`); `figure()` draws any of them, so
a new probe kind needs nothing here. Plain functions returning Plotly figures, tested
without Streamlit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from app.charts.timeseries import PALETTE, right_axis
from probes.kinds.chart import Axis, Chart, Color

COLORS: dict[Color, str] = {
    "c0": PALETTE[0],
    "c1": PALETTE[1],
    "c2": PALETTE[2],
    "c3": PALETTE[3],
    "good": PALETTE[3],
    "bad": PALETTE[2],
    "limit": "#dc2626",
    "reference": "#6b7280",
}


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


def _axis(axis: Axis) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if axis.share:
        out |= {"range": [0, 1.05], "tickformat": ".0%"}
    if axis.log:
        out["type"] = "log"
    if axis.from_zero:
        out["rangemode"] = "tozero"
    if axis.ticks is not None:
        out["tickvals"] = list(axis.ticks)
    return out


def figure(chart: Chart) -> go.Figure:
    """A probe kind's chart as a Plotly figure."""
    fig = go.Figure()
    for t in chart.traces:
        color = COLORS[t.color]
        fig.add_trace(
            go.Scatter(
                x=list(t.x),
                y=list(t.y),
                name=t.name,
                mode=t.mode,
                yaxis=t.axis,
                line={"color": color, "dash": t.dash, "shape": "hv" if t.steps else "linear"},
                marker={
                    "color": [COLORS[c] for c in t.point_colors] if t.point_colors else color,
                    "size": t.size,
                    "symbol": t.symbol,
                },
                text=list(t.hover) if t.hover is not None else None,
                hovertemplate="%{text}<extra></extra>" if t.hover is not None else None,
            )
        )
    for m in chart.marks:
        line = {"color": COLORS[m.color], "dash": m.dash}
        if m.on == "x":
            fig.add_vline(x=m.at, line=line, annotation_text=m.label)
        else:
            fig.add_hline(y=m.at, line=line, annotation_text=m.label)
    for b in chart.bands:
        fig.add_vrect(
            x0=b.start, x1=b.end, fillcolor="#dbeafe", opacity=0.4, line_width=0,
            annotation_text=b.label,
        )  # fmt: skip
    layout: dict[str, Any] = {"xaxis": _axis(chart.x), "yaxis": _axis(chart.y)}
    if chart.y2 is not None:
        layout["yaxis2"] = right_axis(chart.y2.title) | _axis(chart.y2)
    fig.update_layout(**layout)
    return _base(fig, chart.title, chart.x.title, chart.y.title)


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
