"""Probe kinds: the contract every kind fulfils, the registry, and one module per kind.

A kind module (`latency`, `batch_sweep`, `oom`, `kv_usage`, `capacity`, `ab`) declares its
parameters, typed result and progress, how it runs, its form, CLI options and chart
(`contract.ProbeKind`). `context` holds what a run may use; `runner` executes one, with
or without the store. This room may import `planner`, `storage` and the rest of `probes`;
the console imports it for the request and result types, never to run a probe inline.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from planner.errors import UnknownChoice
from probes.kinds import ab, batch_sweep, capacity, kv_usage, latency, oom
from probes.kinds.chart import Axis, Band, Chart, Mark, Trace
from probes.kinds.context import ProbeCancelled, ProbeParams, ProbeProgress, ProbeResult
from probes.kinds.contract import AnyKind, CliOption, FormField, ProbeKind, Row
from storage.schemas import ProbeLimits

if TYPE_CHECKING:
    from probes.kinds.runner import Outcome, StoredRun, execute

__all__ = [
    "KINDS",
    "AnyKind",
    "Axis",
    "Band",
    "Chart",
    "CliOption",
    "FormField",
    "Mark",
    "Outcome",
    "ProbeCancelled",
    "ProbeKind",
    "ProbeParams",
    "ProbeProgress",
    "ProbeResult",
    "Row",
    "StoredRun",
    "Trace",
    "execute",
    "get_kind",
    "parse_params",
]

# The registry: a new kind is a module above and one entry here.
KINDS: dict[str, AnyKind] = {
    k.name: k
    for k in (latency.KIND, batch_sweep.KIND, oom.KIND, kv_usage.KIND, capacity.KIND, ab.KIND)
}
# Keys a run row carries beside the probe's parameters.
RUN_KEYS = ("target_url", "schedule_id")


def get_kind(name: str) -> AnyKind:
    """The kind called `name`."""
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownChoice("probe", name, KINDS) from None


def parse_params(
    kind: str,
    data: Mapping[str, Any],
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
    limits: ProbeLimits | None = None,
) -> ProbeParams:
    """Validated parameters of a probe; InvalidInput names every bad field, or the limit a
    run would go over (with `limits`, as every entry point passes them).

    A `profile` naming one of the user's stored `profiles` is replaced by its definition.
    """
    clean = {k: v for k, v in data.items() if k not in RUN_KEYS}
    name = clean.get("profile")
    if isinstance(name, str) and profiles and name in profiles:
        clean["profile"] = dict(profiles[name])
    probe = get_kind(kind)
    params: ProbeParams = probe.parse(clean)
    if limits is not None:
        probe.check(params, limits)
    return params


def __getattr__(name: str) -> Any:
    """The runner's names, loaded on first use: it needs the store, which the console's
    forms and the CLI's help do not."""
    if name in ("Outcome", "StoredRun", "execute"):
        return getattr(importlib.import_module("probes.kinds.runner"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
