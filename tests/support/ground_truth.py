"""The planner against published vLLM startup logs (tests/fixtures/vllm_startup_logs):
each log parsed by the engine's own log parser, planned from its flags, compared."""

from __future__ import annotations

import statistics
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.capacity import CapacityPlan, plan_capacity
from planner.gpus import get_gpu
from planner.measured import request_from_log
from planner.models import load_preset
from probes.vllm.logparse import StartupReport, read_startup

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_startup_logs"


@dataclass(frozen=True)
class Row:
    """One published start and the planner's answer for it."""

    entry: dict[str, Any]
    report: StartupReport
    plan: CapacityPlan

    @property
    def name(self) -> str:
        return str(self.entry["file"]).removesuffix(".log")

    @property
    def logged(self) -> int:
        assert self.report.kv_tokens is not None
        return self.report.kv_tokens

    @property
    def error(self) -> float:
        """Planned over logged tokens, minus one (positive: the planner promised more)."""
        return self.plan.kv_capacity_tokens / self.logged - 1

    @property
    def unsure(self) -> bool:
        return bool(self.plan.unsure)

    @property
    def in_range(self) -> bool:
        low, high = self.plan.kv_capacity_range
        return low <= self.logged <= high


def entries() -> list[dict[str, Any]]:
    """The fixture's index, in file order."""
    return list(tomllib.loads((FIXTURE / "index.toml").read_text(encoding="utf-8"))["log"])


def evaluate(entry: dict[str, Any]) -> Row:
    """Parse one log and plan its deployment."""
    report = read_startup((FIXTURE / entry["file"]).read_text(encoding="utf-8").splitlines())
    unprinted = entry.get("unprinted", {})
    assert all(getattr(report, k) is None for k in unprinted), f"{entry['file']} prints it"
    report = replace(report, **unprinted)
    request = request_from_log(
        report,
        load_preset(entry["model"]),
        get_gpu(entry["gpu"]),
        weights_dtype=entry.get("weights_dtype", "auto"),
        nodes=entry.get("nodes", 1),
    )
    return Row(entry, report, plan_capacity(request))


def rows() -> list[Row]:
    """Every fixture log, evaluated."""
    return [evaluate(e) for e in entries()]


def median_abs_error(sure: list[Row]) -> float:
    """Median absolute error of the rows the planner gives one number for."""
    return statistics.median(abs(r.error) for r in sure)
