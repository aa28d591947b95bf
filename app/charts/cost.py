"""Chart builders for the Cost page: total cost against reserve, the minimum marked."""

from __future__ import annotations

import plotly.graph_objects as go

from app.charts.timeseries import PALETTE
from planner.cost import CostFrame


def cost_chart(frame: CostFrame, currency: str = "$") -> go.Figure:
    """Cost of reserve, cost of violations and their total per reserve level."""
    x = [r.reserve for r in frame.rows]
    fig = go.Figure()
    for name, values, color, dash in (
        ("reserve GPUs", [r.cost_of_reserve for r in frame.rows], PALETTE[0], "dot"),
        ("SLO violations", [r.cost_of_violation for r in frame.rows], PALETTE[2], "dot"),
        ("total", [r.total for r in frame.rows], PALETTE[4], "solid"),
    ):
        fig.add_trace(
            go.Scatter(
                x=x, y=values, name=name, mode="lines+markers", line={"color": color, "dash": dash}
            )
        )
    best = frame.best
    fig.add_trace(
        go.Scatter(
            x=[best.reserve],
            y=[best.total],
            mode="markers+text",
            name="cheapest",
            text=[f"minimum: {currency}{best.total:,.0f}"],
            textposition="top center",
            marker={"size": 16, "symbol": "star", "color": PALETTE[3]},
        )
    )
    fig.update_layout(
        title={
            "text": f"Total cost against reserve (shares: {frame.source})",
            "x": 0.0,
            "font": {"size": 15},
        },
        height=360,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        template="plotly_white",
        xaxis={"title": "reserve replicas beyond the base", "dtick": 1},
        yaxis={"title": f"cost ({currency})", "rangemode": "tozero"},
        legend={"orientation": "h", "y": 1.0, "x": 1.0, "xanchor": "right", "yanchor": "bottom"},
    )
    return fig
