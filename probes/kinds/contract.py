"""The probe contract: what one probe kind declares, so nothing else needs to know it.

A kind is one module that builds a `ProbeKind`: its parameters (`Params`, strict pydantic),
its typed result and partial progress, how it runs, its title, the fields its form shows,
the options its CLI command takes (types and defaults read from `Params`), its chart, its
table and one headline. The registry (`probes/kinds/__init__.py`) lists the modules; the
console's pages, the CLI and the worker read everything else from here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from planner.errors import InvalidInput
from planner.workload import validated
from probes.kinds.chart import Chart
from probes.kinds.context import (
    PlannedLoad,
    ProbeContext,
    ProbeParams,
    ProbeProgress,
    ProbeResult,
)
from storage.schemas import ProbeLimits

P = TypeVar("P", bound=ProbeParams)
R = TypeVar("R", bound=ProbeResult)
G = TypeVar("G", bound=ProbeProgress)

Row = Mapping[str, float | int | str | bool | None]


@dataclass(frozen=True)
class FormField:
    """A number (or a switch, for a bool) the Probes page's form shows for a `Params` field.

    `default` stands in where `Params` has none (a required bound, or a length that is
    otherwise taken from a profile).
    """

    name: str
    label: str
    default: float | int | bool | None = None


@dataclass(frozen=True)
class CliOption:
    """A CLI option for a `Params` field; type, default and help come from the field.

    `flag` renames it (`duration` for `duration_s`); `sets` makes it a plain switch that
    stores that value in the field (`--bisect` sets `search="bisect"`).
    """

    field: str
    flag: str | None = None
    help: str | None = None
    sets: Any = None

    @property
    def option(self) -> str:
        return "--" + (self.flag or self.field).replace("_", "-")


@dataclass(frozen=True)
class ProbeKind(Generic[P, R, G]):
    """One probe kind, complete."""

    name: str
    title: str
    command: str  # the `kvscope probe COMMAND` name
    summary: str  # one line: what it does and reports
    params: type[P]
    result: type[R]
    progress: type[G]
    run: Callable[[ProbeContext, P], Awaitable[R]]
    form: Sequence[FormField]
    cli: Sequence[CliOption]
    chart: Callable[[R], Chart]
    headline: Callable[[R], str]
    partial_chart: Callable[[G], Chart | None] = lambda progress: None
    # Charts drawn below the main one (the tail against the request rate).
    more_charts: Callable[[R], list[Chart]] = lambda result: []
    table: Callable[[R], list[Row]] = lambda result: []
    notes: Callable[[R], list[str]] = lambda result: []
    # Destructive kinds need a confirmation and an engine kvscope manages; `danger` says
    # what they do to it ("pushes an engine until it fails").
    destructive: bool = False
    danger: str = ""
    records_cdf: bool = False  # the page draws CDFs of its request records
    extra: Mapping[str, Any] = field(default_factory=dict)

    def parse(self, data: Mapping[str, Any]) -> P:
        """Validated parameters; InvalidInput names every bad field."""
        return validated(self.params, data, f"{self.name} parameters")

    def admit(self, params: P, managed: bool) -> None:
        """Refuse a destructive probe on an engine kvscope does not manage, unless allowed."""
        if self.destructive and not managed and not getattr(params, "allow_external", False):
            external = "allow_external" in type(params).model_fields
            raise InvalidInput(
                f"the {self.name} probe {self.danger}: it runs on an engine kvscope manages"
                + (
                    ", or on another one with allow_external set (--set allow_external=true)"
                    if external
                    else ""
                )
            )

    def check(self, params: P, limits: ProbeLimits) -> PlannedLoad:
        """Refuse, with one line naming the limit, a run that asks more than the limits allow."""
        load = params.load()
        over = [
            (load.rate, limits.max_rate, "rate", "req/s", "MAX_RATE"),
            (load.step_s, limits.max_duration_s, "duration", "s", "MAX_DURATION_S"),
            (load.requests, limits.max_requests, "planned requests", "", "MAX_REQUESTS"),
            (load.in_flight, limits.max_in_flight, "requests in flight", "", "MAX_IN_FLIGHT"),
        ]
        for asked, limit, what, unit, env in over:
            if asked is not None and asked > limit:
                raise InvalidInput(
                    f"the {self.name} probe asks for {_num(asked)}{unit and ' ' + unit} {what}, "
                    f"over the limit of {_num(limit)} (KVSCOPE_PROBE_LIMITS__{env})"
                )
        return load

    def deadline_s(self, params: P, limits: ProbeLimits) -> float:
        """How long a run may take before it is stopped as timed out."""
        return min(limits.max_run_s, params.load().run_s * 1.5 + 120.0)

    def read_result(self, data: Mapping[str, Any]) -> R:
        """A stored result, typed."""
        return validated(self.result, data, f"stored {self.name} result")

    def read_progress(self, data: Mapping[str, Any]) -> G:
        """Stored partial progress, typed."""
        return validated(self.progress, data, f"{self.name} progress")


AnyKind = ProbeKind[Any, Any, Any]


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.3g}"


def dump_rows(models: Sequence[BaseModel], keys: Sequence[str]) -> list[Row]:
    """Rows for a table: the named fields of each model (dotted names reach into one level)."""
    rows: list[Row] = []
    for m in models:
        row: dict[str, float | int | str | bool | None] = {}
        for key in keys:
            head, _, sub = key.partition(".")
            value = getattr(m, head)
            row[key] = getattr(value, sub) if sub else value
        rows.append(row)
    return rows
