"""Plotly figures for the Planner page: plain functions from planner results to Figures.

No Streamlit here, so every builder is testable on its own; the page only renders them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go

GIB = 1 << 30
_PART_COLOURS = {
    "weights": "#4C78A8",
    "kv_cache": "#54A24B",
    "activation_peak": "#F58518",
    "non_torch": "#B279A2",
    "cuda_graphs": "#E45756",
    "kv_rounding": "#9D755D",
    "unused_headroom": "#BAB0AC",
}
_LINE_COLOURS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2")


def memory_breakdown_figure(parts: Mapping[str, int], title: str = "GPU memory") -> go.Figure:
    """One horizontal stacked bar: weights, KV cache, overheads and headroom in GiB."""
    fig = go.Figure()
    for name, value in parts.items():
        if value <= 0:
            continue
        fig.add_bar(
            y=[""],
            x=[value / GIB],
            name=name.replace("_", " "),
            orientation="h",
            marker_color=_PART_COLOURS.get(name),
            hovertemplate=f"{name.replace('_', ' ')}: %{{x:.2f}} GiB<extra></extra>",
        )
    fig.update_layout(
        barmode="stack",
        title=title,
        xaxis_title="GiB",
        height=220,
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.6},
    )
    return fig


def concurrency_figure(
    contexts: npt.ArrayLike,
    series: Mapping[str, npt.ArrayLike],
    marker: tuple[int, float] | None = None,
) -> go.Figure:
    """Max concurrency (requests that fit at once) against context length, one line per KV dtype."""
    fig = go.Figure()
    x = np.asarray(contexts)
    for i, (label, values) in enumerate(series.items()):
        fig.add_scatter(
            x=x,
            y=np.asarray(values),
            mode="lines",
            name=label,
            line={"color": _LINE_COLOURS[i % len(_LINE_COLOURS)]},
            hovertemplate="%{x:,} tokens: %{y:.2f}x<extra>" + label + "</extra>",
        )
    if marker is not None:
        fig.add_scatter(
            x=[marker[0]],
            y=[marker[1]],
            mode="markers",
            name="this plan",
            marker={"size": 11, "color": "black", "symbol": "x"},
        )
    fig.update_layout(
        title="Max concurrency vs context",
        xaxis={"title": "context (tokens)", "type": "log"},
        yaxis={"title": "sequences at once (vLLM max concurrency)", "type": "log"},
        height=380,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return fig


def fits_map_figure(
    contexts: npt.ArrayLike,
    batches: npt.ArrayLike,
    fits: npt.ArrayLike,
    frontiers: Mapping[str, npt.ArrayLike],
) -> go.Figure:
    """Context x batch grid coloured fits / OOM, with the OOM frontier of each KV dtype."""
    ctx = np.asarray(contexts)
    b = np.asarray(batches)
    grid = np.asarray(fits, dtype=float)
    fig = go.Figure(
        go.Heatmap(
            x=ctx,
            y=b,
            z=grid,
            zmin=0,
            zmax=1,
            colorscale=[[0, "#F4B6B6"], [0.5, "#F4B6B6"], [0.5, "#B9DDB1"], [1, "#B9DDB1"]],
            showscale=False,
            hovertemplate="context %{x:,} x batch %{y}: %{z}<extra>1 = fits, 0 = OOM</extra>",
        )
    )
    for i, (label, frontier) in enumerate(frontiers.items()):
        fig.add_scatter(
            x=np.asarray(frontier),
            y=b,
            mode="lines",
            name=f"OOM frontier, {label}",
            line={"color": _LINE_COLOURS[i % len(_LINE_COLOURS)], "width": 2},
            hovertemplate="batch %{y}: up to %{x:,} tokens<extra>" + label + "</extra>",
        )
    fig.update_layout(
        title="What fits: context x batch",
        xaxis={"title": "context (tokens per sequence)", "range": [0, float(ctx.max())]},
        yaxis={"title": "batch (sequences at once)"},
        height=420,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return fig


def attention_figure(
    labels: Sequence[str], bytes_per_token: Sequence[int], capacity_tokens: Sequence[int]
) -> go.Figure:
    """KV bytes per token and token capacity for MHA / GQA / MQA / MLA variants of a model."""
    fig = go.Figure()
    fig.add_bar(
        x=list(labels),
        y=[v / 1024 for v in bytes_per_token],
        name="KV KiB per token",
        marker_color="#4C78A8",
        text=[f"{v / 1024:,.1f} KiB" for v in bytes_per_token],
        textposition="outside",
        yaxis="y",
        offsetgroup="a",
    )
    fig.add_bar(
        x=list(labels),
        y=list(capacity_tokens),
        name="tokens that fit",
        marker_color="#54A24B",
        yaxis="y2",
        offsetgroup="b",
    )
    fig.update_layout(
        title="MHA vs GQA vs MQA vs MLA: same model, same memory",
        yaxis={"title": "KiB per token (all layers)", "type": "log"},
        yaxis2={"title": "tokens that fit", "overlaying": "y", "side": "right", "type": "log"},
        barmode="group",
        height=380,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def fragmentation_figure(contiguous_waste: float, paged_waste: float) -> go.Figure:
    """Share of reserved KV memory holding no token: contiguous max-length slab vs paged."""
    fig = go.Figure(
        go.Bar(
            x=["contiguous max-length reservation", "paged blocks (vLLM)"],
            y=[contiguous_waste * 100, paged_waste * 100],
            marker_color=["#E45756", "#54A24B"],
            text=[f"{contiguous_waste:.1%}", f"{paged_waste:.2%}"],
            textposition="outside",
        )
    )
    fig.update_layout(
        title="Wasted KV memory, averaged over decoding",
        yaxis={"title": "% of reserved memory holding no token", "range": [0, 100]},
        height=340,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return fig


def comparison_figure(labels: Sequence[str], values: Sequence[float], title: str) -> go.Figure:
    """One bar per configuration (side-by-side comparison)."""
    fig = go.Figure(go.Bar(x=list(labels), y=list(values), marker_color="#72B7B2"))
    fig.update_layout(title=title, height=300, margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig
