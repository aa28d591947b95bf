"""Plotly figures for the What-if page: predicted tails against rate, KV usage over time.

No Streamlit here, so every builder is testable on its own; the page only renders them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from planner.simulate.whatif import Prediction, RatePoint

_COLOURS = ("#4C78A8", "#F58518", "#54A24B", "#E45756")


def tail_figure(
    curves: Mapping[str, Sequence[RatePoint]], slo_ttft_s: float | None = None
) -> go.Figure:
    """p99 (solid, with the seeds' 80 % band where there is one) and p50 (dotted) TTFT
    against rate, one colour per setting, with the SLO's TTFT bound."""
    fig = go.Figure()
    for i, (label, points) in enumerate(curves.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        rates = [p.prediction.rate for p in points]
        bands = [p.ttft_p99 for p in points]
        if all(b is not None for b in bands):
            high = [b.high * 1000 for b in bands if b is not None]
            low = [b.low * 1000 for b in bands if b is not None]
            fig.add_scatter(
                x=rates + rates[::-1],
                y=high + low[::-1],
                fill="toself",
                line={"width": 0},
                fillcolor=colour,
                opacity=0.2,
                name=f"{label}: p99 80% band",
                hoverinfo="skip",
            )
        for q, dash in (("p99", "solid"), ("p50", "dot")):
            values = [getattr(p.prediction.ttft_s, q) for p in points]
            fig.add_scatter(
                x=rates,
                y=[None if v is None else v * 1000 for v in values],
                mode="lines+markers",
                line={"color": colour, "dash": dash},
                name=f"{label}: TTFT {q}",
                hovertemplate=f"{label}<br>%{{x:.2f}} req/s: {q} %{{y:,.0f}} ms<extra></extra>",
            )
    if slo_ttft_s is not None:
        fig.add_hline(
            y=slo_ttft_s * 1000,
            line={"color": "#E45756", "dash": "dash"},
            annotation_text="SLO TTFT bound",
        )
    fig.update_layout(
        title="Predicted TTFT against request rate",
        xaxis_title="requests / s",
        yaxis_title="TTFT (ms)",
        yaxis_type="log",
        height=380,
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def kv_figure(predictions: Mapping[str, Prediction]) -> go.Figure:
    """KV blocks in use (share) and requests waiting over one run, per setting."""
    fig = go.Figure()
    for i, (label, p) in enumerate(predictions.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        t = [row[0] for row in p.timeline]
        fig.add_scatter(
            x=t,
            y=[row[1] * 100 for row in p.timeline],
            name=f"{label}: KV usage %",
            line={"color": colour},
        )
        fig.add_scatter(
            x=t,
            y=[row[2] for row in p.timeline],
            name=f"{label}: waiting",
            line={"color": colour, "dash": "dot"},
            yaxis="y2",
        )
    fig.update_layout(
        title="KV usage and queue over one run",
        xaxis_title="simulated seconds",
        yaxis={"title": "KV blocks in use (%)", "range": [0, 105]},
        yaxis2={"title": "requests waiting", "overlaying": "y", "side": "right"},
        height=340,
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.3},
    )
    return fig
