"""The Fleet page's chart: every replica's KV usage side by side, its queue beside it."""

from __future__ import annotations

import plotly.graph_objects as go

from app.charts.timeseries import right_axis
from storage.dashboards import Pool


def replicas_figure(pool: Pool) -> go.Figure:
    """KV usage per replica (bars; the hot one darker) and requests waiting (markers)."""
    names = [r.name for r in pool.replicas]
    colours = ["#b2182b" if n == pool.hot else "#4393c3" for n in names]
    fig = go.Figure()
    fig.add_bar(
        x=names,
        y=[r.kv_usage for r in pool.replicas],
        marker_color=colours,
        name="KV usage",
        hovertemplate="%{x}: %{y:.0%}<extra>KV usage</extra>",
    )
    fig.add_scatter(
        x=names,
        y=[r.waiting for r in pool.replicas],
        mode="markers",
        marker={"size": 10, "color": "#333"},
        name="waiting",
        yaxis="y2",
    )
    fig.update_layout(
        title="KV usage and queue per replica",
        yaxis={"title": "KV usage", "tickformat": ".0%", "range": [0, 1]},
        yaxis2=right_axis("requests waiting"),
        margin={"t": 40, "b": 40},
        legend={"orientation": "h"},
    )
    return fig
