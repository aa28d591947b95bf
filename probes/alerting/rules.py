"""Early-warning alert rules: what each kind watches, its defaults, and a user's edits.

One definition serves the worker's evaluator (`probes/alerting/evaluate.py`, on kvscope's stored
series) and the exports for teams that alert with Prometheus (`app/exports/`). Every
rule has a threshold, a duration (`for_s`: how long the condition must hold before it
fires), a window for the rates, slopes and quantiles it looks at, and a severity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from planner.errors import InvalidInput, validation_message
from storage.schemas import TargetRow, check_labels

# Observations a window needs before a quantile ratio or a tail comparison means anything;
# the worker's evaluator and the exported Prometheus rules both use it.
MIN_COUNT = 10


class RuleKind(StrEnum):
    """The conditions kvscope can warn about."""

    KV_SLOPE = "kv_slope"  # KV usage rising while the request rate is steady
    KV_LEVEL = "kv_level"  # KV usage above a level
    PREEMPTIONS = "preemptions"  # preemptions per second above a threshold (default 0)
    QUEUE_DEPTH = "queue_depth"  # waiting requests above a level
    TAIL_RATIO = "tail_ratio"  # p99/p50 of TTFT or ITL above a ratio
    P99_OVER_SLO = "p99_over_slo"  # p99 of TTFT or TPOT above a bound (the SLO's by default)
    OUTPUT_TAIL = "output_tail"  # p99 output length grew against the window before
    TARGET_DOWN = "target_down"  # the target does not answer
    ENGINE_RESTARTING = "engine_restarting"  # managed engine crashed or restarted
    SLO_BURN = "slo_burn"  # the SLO's error budget burning fast over a long and a short window


DESCRIPTIONS: dict[RuleKind, str] = {
    RuleKind.KV_SLOPE: "KV usage rises faster than {threshold:.1%} of the cache per minute over "
    "{window}, while the request rate stays steady (within {stable:.0%})",
    RuleKind.KV_LEVEL: "KV usage above {threshold:.0%}",
    RuleKind.PREEMPTIONS: "more than {threshold:g} preemptions per second over {window}",
    RuleKind.QUEUE_DEPTH: "more than {threshold:g} requests waiting{per_running}",
    RuleKind.TAIL_RATIO: "{metric} p99/p50 above {threshold:g} over {window}{baseline}",
    RuleKind.P99_OVER_SLO: "{metric} p99 above {threshold:g} s over {window}",
    RuleKind.OUTPUT_TAIL: "p99 output length over {window} more than {threshold:g}x the "
    "window before",
    RuleKind.TARGET_DOWN: "the target does not answer its metrics scrape",
    RuleKind.ENGINE_RESTARTING: "the managed engine crashed or restarted at least "
    "{threshold:g} times in {window}",
    RuleKind.SLO_BURN: "the SLO's error budget burns faster than {threshold:g}x over {window} "
    "and over {short}",
}

# A burn-rate rule also looks at a window this many times shorter than its own, so that it
# resolves soon after the burning stops (Google's SRE workbook: 1 h with 5 min, 6 h with
# 30 min).
SHORT_WINDOW_DIVISOR = 12


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


class AlertRule(BaseModel):
    """One rule as a user edits it (stored in `alert_rules`)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    kind: RuleKind
    threshold: float = Field(ge=0)
    for_s: float = Field(60.0, ge=0, le=7 * 86400, description="how long it must hold")
    window_s: float = Field(300.0, gt=0, le=7 * 86400, description="rates and quantiles over")
    severity: Literal["info", "warning", "critical"] = "warning"
    metric: Literal["ttft", "itl", "tpot"] | None = None
    stable_rate: float = Field(
        0.2,
        gt=0,
        le=1,
        description="kv_slope: the request rate's "
        "coefficient of variation that still counts as steady",
    )
    target: str | None = Field(None, description="a target's name; none: every target")
    labels: dict[str, str] = Field(
        default_factory=dict, description="only targets carrying all these labels"
    )
    enabled: bool = True
    # Relative conditions, as the seeds advise, beside the fixed numbers:
    per_running: bool = Field(
        False, description="queue_depth: waiting per running request (the pool), not a count"
    )
    baseline_s: float | None = Field(
        None,
        gt=0,
        le=30 * 86400,
        description="tail_ratio: also above baseline_factor x its own ratio over this long",
    )
    baseline_factor: float = Field(1.5, ge=1, le=100)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_labels(v)

    def applies_to(self, target: TargetRow) -> bool:
        """Whether the rule watches `target` (its name, if it names one, and its labels)."""
        if self.target and target.name != self.target:
            return False
        return all(target.labels.get(k) == v for k, v in self.labels.items())

    @model_validator(mode="after")
    def _fits(self) -> AlertRule:
        needs_metric = self.kind in (RuleKind.TAIL_RATIO, RuleKind.P99_OVER_SLO)
        if needs_metric and self.metric is None:
            raise ValueError(f"a {self.kind.value} rule needs a metric: ttft, itl or tpot")
        if not needs_metric and self.metric is not None:
            raise ValueError(f"a {self.kind.value} rule takes no metric")
        if self.kind is RuleKind.KV_LEVEL and self.threshold > 1:
            raise ValueError("kv_level is a share of the cache: a threshold from 0 to 1")
        if self.kind is RuleKind.TAIL_RATIO and self.threshold < 1:
            raise ValueError("a p99/p50 ratio is at least 1")
        if self.per_running and self.kind is not RuleKind.QUEUE_DEPTH:
            raise ValueError("per_running is for queue_depth rules")
        if self.baseline_s is not None:
            if self.kind is not RuleKind.TAIL_RATIO:
                raise ValueError("a baseline is for tail_ratio rules")
            if self.baseline_s <= self.window_s:
                raise ValueError("the baseline must be longer than the rule's window")
        return self

    def describe(self) -> str:
        """The condition in words."""
        return DESCRIPTIONS[self.kind].format(
            threshold=self.threshold,
            window=_span(self.window_s),
            metric=(self.metric or "").upper(),
            stable=self.stable_rate,
            short=_span(self.short_window_s),
            per_running=" per running request" if self.per_running else "",
            baseline=(
                f" and {self.baseline_factor:g}x its ratio over the last {_span(self.baseline_s)}"
                if self.baseline_s
                else ""
            ),
        )

    @property
    def short_window_s(self) -> float:
        """A burn-rate rule's second, shorter window."""
        return self.window_s / SHORT_WINDOW_DIVISOR


def parse_rule(data: dict[str, Any]) -> AlertRule:
    """Validate a rule from a form or the store; InvalidInput names the bad fields."""
    try:
        return AlertRule.model_validate(data)
    except ValidationError as err:
        raise InvalidInput(f"alert rule refused: {validation_message(err)}") from err


@dataclass(frozen=True)
class ParsedRules:
    """Stored rules by their id, in stored order: those that validate, and why the others
    do not (a row written by hand or by another kvscope version)."""

    valid: dict[int, AlertRule]
    invalid: dict[int, str]


def rules_from_rows(rows: Iterable[tuple[int, dict[str, Any]]]) -> ParsedRules:
    """Parse stored `(id, data)` rows; an invalid row is set aside with its reason, so one
    bad rule never stops the evaluator, the exports or the Alerts page."""
    valid: dict[int, AlertRule] = {}
    invalid: dict[int, str] = {}
    for rule_id, data in rows:
        try:
            valid[rule_id] = parse_rule(data)
        except InvalidInput as err:
            invalid[rule_id] = str(err)
    return ParsedRules(valid, invalid)


DEFAULT_RULES: tuple[AlertRule, ...] = (
    AlertRule(
        name="KV usage creeping up", kind=RuleKind.KV_SLOPE, threshold=0.02, for_s=120, window_s=600
    ),
    AlertRule(
        name="KV cache nearly full",
        kind=RuleKind.KV_LEVEL,
        threshold=0.9,
        for_s=60,
        window_s=60,
        severity="critical",
    ),
    AlertRule(name="Preemptions", kind=RuleKind.PREEMPTIONS, threshold=0.0, for_s=30, window_s=60),
    AlertRule(
        name="Requests queueing", kind=RuleKind.QUEUE_DEPTH, threshold=4, for_s=60, window_s=60
    ),
    AlertRule(
        name="TTFT tail drifting from the median",
        kind=RuleKind.TAIL_RATIO,
        metric="ttft",
        threshold=5.0,
        for_s=300,
        window_s=300,
    ),
    AlertRule(
        name="ITL tail drifting from the median",
        kind=RuleKind.TAIL_RATIO,
        metric="itl",
        threshold=3.0,
        for_s=300,
        window_s=300,
    ),
    AlertRule(
        name="TTFT p99 over the SLO",
        kind=RuleKind.P99_OVER_SLO,
        metric="ttft",
        threshold=2.0,
        for_s=300,
        window_s=300,
        severity="critical",
    ),
    AlertRule(
        name="TPOT p99 over the SLO",
        kind=RuleKind.P99_OVER_SLO,
        metric="tpot",
        threshold=0.1,
        for_s=300,
        window_s=300,
        severity="critical",
    ),
    AlertRule(
        name="Output lengths growing",
        kind=RuleKind.OUTPUT_TAIL,
        threshold=1.5,
        for_s=0,
        window_s=1800,
        severity="info",
    ),
    AlertRule(
        name="Target down",
        kind=RuleKind.TARGET_DOWN,
        threshold=0,
        for_s=30,
        window_s=60,
        severity="critical",
    ),
    AlertRule(
        name="Engine restarting",
        kind=RuleKind.ENGINE_RESTARTING,
        threshold=1,
        for_s=0,
        window_s=900,
        severity="critical",
    ),
    # Multi-window burn-rate alerts (Google's SRE workbook, ch. 5): 14.4x over 1 h spends 2%
    # of a 30-day budget in that hour; 6x over 6 h, 5%.
    AlertRule(
        name="SLO budget burning fast",
        kind=RuleKind.SLO_BURN,
        threshold=14.4,
        for_s=0,
        window_s=3600,
        severity="critical",
    ),
    AlertRule(
        name="SLO budget burning",
        kind=RuleKind.SLO_BURN,
        threshold=6.0,
        for_s=0,
        window_s=6 * 3600,
        severity="warning",
    ),
)
