"""Chart builders for the monitoring pages: plain functions from DataFrames to Plotly figures.

No Streamlit here, so each builder is tested on its own. Time axes are UTC.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go

from storage.names import METRICS

PALETTE = ("#2563eb", "#f97316", "#dc2626", "#16a34a", "#9333ea", "#0891b2")


def right_axis(title: str) -> dict[str, object]:
    """A second y axis on the right, from zero, without its own grid (`yaxis2=`)."""
    return {
        "overlaying": "y",
        "side": "right",
        "title": title,
        "rangemode": "tozero",
        "showgrid": False,
    }


QUANTILE_COLORS = {"p50": "#2563eb", "p95": "#f97316", "p99": "#dc2626"}


def _times(index: pd.Index) -> pd.DatetimeIndex:
    return pd.to_datetime(index.to_numpy(), unit="s", utc=True)


def _layout(fig: go.Figure, title: str, y_title: str, percent: bool = False) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.0, "font": {"size": 15}},
        height=280,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        legend={"orientation": "h", "y": 1.0, "x": 1.0, "xanchor": "right", "yanchor": "bottom"},
        hovermode="x unified",
        xaxis_title="time (UTC)",
        yaxis_title=y_title,
        template="plotly_white",
    )
    if percent:  # fractions: the whole 0-100% scale, so a full cache looks full
        fig.update_layout(yaxis={"range": [0, 1.05], "tickformat": ".0%"})
    else:
        fig.update_layout(yaxis={"rangemode": "tozero"})
    return fig


def timeseries(
    frame: pd.DataFrame,
    columns: Mapping[str, str],
    title: str,
    y_title: str,
    percent: bool = False,
    secondary: Mapping[str, str] | None = None,
    peaks: bool = True,
) -> go.Figure:
    """Lines for `columns` ({column: legend label}); `secondary` ones on a right axis.

    Gauges are drawn as steps: a stored value holds until the next one. Where the frame has
    a `<column>_max` (read from rollups), the band up to it is shaded: the peaks within
    each bucket, which its average would hide.
    """
    fig = go.Figure()
    x = _times(frame.index)
    for i, (col, label) in enumerate(columns.items()):
        if col in frame:
            color = PALETTE[i % len(PALETTE)]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=frame[col],
                    name=label,
                    mode="lines",
                    line={"color": color, "shape": "hv"},
                )
            )
            if peaks and f"{col}_max" in frame:
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=frame[f"{col}_max"],
                        name=f"{label} (peak)",
                        mode="lines",
                        fill="tonexty",
                        opacity=0.3,
                        line={"color": color, "shape": "hv", "width": 0.5},
                    )
                )
    for j, (col, label) in enumerate((secondary or {}).items()):
        if col in frame:
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=frame[col],
                    name=label,
                    mode="lines",
                    yaxis="y2",
                    line={
                        "color": PALETTE[(j + len(columns)) % len(PALETTE)],
                        "dash": "dot",
                        "shape": "hv",
                    },
                )
            )
    if secondary:
        fig.update_layout(yaxis2=right_axis(", ".join(secondary.values())))
    return _layout(fig, title, y_title, percent)


def quantile_chart(frame: pd.DataFrame, histogram: str) -> go.Figure:
    """p50/p95/p99 of one latency histogram over time."""
    m = METRICS[histogram]
    fig = go.Figure()
    x = _times(frame.index)
    for col, color in QUANTILE_COLORS.items():
        if col in frame:
            fig.add_trace(
                go.Scatter(x=x, y=frame[col], name=col, mode="lines", line={"color": color})
            )
    return _layout(fig, f"{m.title} ({histogram.upper()})", f"seconds ({m.unit})")


def ratio_chart(frames: Mapping[str, pd.DataFrame], alert_at: float | None = None) -> go.Figure:
    """The p99/p50 ratio of every latency histogram: the tail drifting away from the median."""
    fig = go.Figure()
    for i, (h, frame) in enumerate(frames.items()):
        if "ratio" in frame:
            fig.add_trace(
                go.Scatter(
                    x=_times(frame.index),
                    y=frame["ratio"],
                    mode="lines",
                    name=h.upper(),
                    line={"color": PALETTE[i % len(PALETTE)]},
                )
            )
    if alert_at:
        fig.add_hline(
            y=alert_at,
            line={"dash": "dash", "color": "#dc2626"},
            annotation_text=f"ratio {alert_at:g}",
        )
    return _layout(fig, "Tail ratio p99 / p50", "ratio")


CAUSE_COLORS = {
    "down": "#6b7280",
    "errors": "#dc2626",
    "kv_pressure": "#9333ea",
    "queueing": "#f97316",
    "prefill_interference": "#0891b2",
    "decode_slowdown": "#ca8a04",
}


def cause_bands(fig: go.Figure, windows: list[tuple[float, float, str]]) -> go.Figure:
    """Shade each window (start, end, cause) that names a cause, labelled with it: where on
    the time axis the tail broke, and why."""
    for start, end, cause in windows:
        if cause not in CAUSE_COLORS:
            continue  # none: nothing to shade
        x0, x1 = _times(pd.Index([start, end]))
        fig.add_vrect(
            x0=x0,
            x1=x1,
            fillcolor=CAUSE_COLORS[cause],
            opacity=0.15,
            line_width=0,
            annotation_text=cause,
            annotation_position="top left",
            annotation_font_size=10,
        )
    return fig
