"""A chart as data: what a probe kind wants drawn, without a plotting library.

A kind says which lines, markers, limits and shaded spans its result has; the console's
one renderer (`app/charts/probes.py`) turns that into a Plotly figure. So a new probe kind
brings its chart in its own module, and the worker never imports Plotly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

# Colours by role; the renderer maps them onto its palette.
Color = Literal["c0", "c1", "c2", "c3", "good", "bad", "limit", "reference"]
X = float | str | None


@dataclass(frozen=True)
class Trace:
    """One line or set of markers."""

    name: str
    x: Sequence[X]
    y: Sequence[float | None]
    mode: Literal["lines", "markers", "lines+markers"] = "lines"
    axis: Literal["y", "y2"] = "y"
    color: Color = "c0"
    dash: Literal["solid", "dot", "dash"] = "solid"
    steps: bool = False  # hold each value until the next (gauges sampled over time)
    point_colors: Sequence[Color] | None = None
    symbol: Literal["circle", "x"] = "circle"
    size: int = 8
    hover: Sequence[str] | None = None


@dataclass(frozen=True)
class Mark:
    """A vertical (`on="x"`) or horizontal (`on="y"`) line with a label: a knee, a limit."""

    at: float
    label: str
    on: Literal["x", "y"] = "x"
    color: Color = "limit"
    dash: Literal["dot", "dash"] = "dash"


@dataclass(frozen=True)
class Band:
    """A shaded span of the x axis (a load window)."""

    start: float
    end: float
    label: str


@dataclass(frozen=True)
class Axis:
    """An axis: its title, and whether it is a share (0-100 %), logarithmic, or from zero."""

    title: str
    share: bool = False
    log: bool = False
    from_zero: bool = False
    ticks: Sequence[float] | None = None


@dataclass(frozen=True)
class Chart:
    """Everything the renderer needs for one figure."""

    title: str
    x: Axis
    y: Axis
    traces: Sequence[Trace]
    y2: Axis | None = None
    marks: Sequence[Mark] = field(default_factory=tuple)
    bands: Sequence[Band] = field(default_factory=tuple)


@dataclass(frozen=True)
class TailPoint:
    """The latency percentiles measured at one request rate."""

    rate: float
    ttft_p50: float | None
    ttft_p99: float | None
    token_p50: float | None
    token_p99: float | None


def tail_against_rate(
    points: Sequence[TailPoint],
    token: str,
    knee_rate: float | None = None,
    knee_label: str = "knee",
    ttft_bound: float | None = None,
    token_bound: float | None = None,
) -> Chart:
    """p50 and p99 of TTFT and of the per-token latency (`token`: TPOT or ITL) against the
    request rate, as the seed articles draw the tail pulling away from the median under
    load: the knee and the SLO's bounds marked."""
    ordered = sorted(points, key=lambda p: p.rate)
    x = [p.rate for p in ordered]
    series = (
        ("TTFT p50", [p.ttft_p50 for p in ordered], "c0", "dot"),
        ("TTFT p99", [p.ttft_p99 for p in ordered], "c0", "solid"),
        (f"{token} p50", [p.token_p50 for p in ordered], "c1", "dot"),
        (f"{token} p99", [p.token_p99 for p in ordered], "c1", "solid"),
    )
    traces = [
        Trace(name, x, ys, "lines+markers", color=color, dash=dash)  # type: ignore[arg-type]
        for name, ys, color, dash in series
    ]
    marks = []
    if knee_rate is not None:
        marks.append(Mark(knee_rate, f"{knee_label}: {knee_rate:.3g} req/s"))
    if ttft_bound is not None:
        marks.append(Mark(ttft_bound, f"TTFT bound {ttft_bound:g} s", on="y"))
    if token_bound is not None:
        marks.append(Mark(token_bound, f"{token} bound {token_bound:g} s", on="y", dash="dot"))
    return Chart(
        title="The tail against the request rate",
        x=Axis("requests/s"),
        y=Axis("seconds", log=True),
        traces=traces,
        marks=marks,
    )
