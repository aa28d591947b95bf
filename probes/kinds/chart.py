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
