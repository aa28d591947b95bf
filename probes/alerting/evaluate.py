"""Evaluate the alert rules on kvscope's stored series; fire and resolve alerts as events.

A rule's condition must hold at every point of its last `for_s` seconds (checked on a grid
over the stored data, so a worker restart loses no pending state) to fire; it resolves
when it no longer holds now. Each evaluation reads only the recent window of a target's
series, which keeps a pass fast however much history is stored.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from planner.errors import KvscopeError
from planner.slo import SLO, parse_slo
from planner.stats import linear_trend
from probes.alerting.rules import MIN_COUNT, AlertRule, RuleKind, rules_from_rows
from storage import derived as d
from storage import queries as q
from storage.dashboards import burn_rate
from storage.schemas import TargetRow

CRASH_EVENTS = ("engine_crashed", "engine_failed")
# Rules judged on a target that is down; the others need its (absent) fresh series.
ABOUT_THE_TARGET = (RuleKind.TARGET_DOWN, RuleKind.ENGINE_RESTARTING)


@dataclass(frozen=True)
class Finding:
    """Whether a rule's condition holds on a target now, the value behind it, and why."""

    active: bool
    value: float | None
    detail: str


def _grid(now: float, for_s: float, window_s: float = 0.0) -> d.Grid:
    """Points over the last `for_s` seconds, evenly spaced from its start to now (a single
    point when it is 0), read at the resolution the whole span needs: raw samples are kept
    only for hours, so a rule over days reads the rollups (the same choice as the pages').
    The step is shortened to land on the start: a 4 s rule on 5 s points would be judged on
    one sample, a 7 s one on its last 5 s."""
    res = d.choose_resolution(for_s + window_s)
    if for_s <= 0:
        return d.Grid(now, now, 1.0, res)
    widest = max(5.0, min(30.0, for_s / 6), float(res))
    step = for_s / math.ceil(for_s / widest)
    # A hair before the start, so rounding does not drop the point on it.
    return d.Grid(now - for_s - 1e-6 * step, now, step, res)


def _sustained(values: np.ndarray, above: float) -> tuple[bool, float | None]:
    """All points present and above the threshold; the latest value."""
    ok = ~np.isnan(values)
    last = float(values[ok][-1]) if ok.any() else None
    return bool(ok.all() and len(values) and (values > above).all()), last


def _slope_per_min(ts: np.ndarray, ys: np.ndarray) -> float | None:
    ok = ~np.isnan(ys)
    line = linear_trend(ts[ok], ys[ok])
    return None if line is None else line.slope * 60


Quantiles = dict[tuple[int, str, d.Grid, float], pd.DataFrame]


def evaluate(
    store: Engine,
    rule: AlertRule,
    target: TargetRow,
    now: float,
    bound: float | None = None,
    memo: Quantiles | None = None,
    slo: SLO | None = None,
) -> Finding:
    """The rule's condition on one target at `now`. `bound` overrides the threshold of a
    p99-over-SLO rule when an SLO applies to the target; `slo` is that SLO, whose budget a
    burn-rate rule watches. `memo` shares histogram quantiles between the rules of one pass
    (the tail-ratio and p99-over-SLO rules read the same)."""
    tid, grid = target.id, _grid(now, rule.for_s, rule.window_s)
    memo = {} if memo is None else memo

    def quantiles(metric: str, grid: d.Grid, window_s: float) -> pd.DataFrame:
        key = (tid, metric, grid, window_s)
        if key not in memo:
            memo[key] = d.quantiles(store, tid, metric, grid, window_s)
        return memo[key]

    kind = rule.kind
    if kind is RuleKind.QUEUE_DEPTH and rule.per_running:
        waiting = d.gauge(store, tid, "waiting", grid).to_numpy()
        running = d.gauge(store, tid, "running", grid).to_numpy()
        active, last = _sustained(waiting / np.maximum(running, 1.0), rule.threshold)
        return Finding(active, last, f"{last or 0:.2g} requests waiting per running request")
    if kind in (RuleKind.KV_LEVEL, RuleKind.QUEUE_DEPTH):
        metric = "kv_usage" if kind is RuleKind.KV_LEVEL else "waiting"
        active, last = _sustained(d.gauge(store, tid, metric, grid).to_numpy(), rule.threshold)
        shown = f"{last:.0%}" if kind is RuleKind.KV_LEVEL and last is not None else f"{last}"
        return Finding(active, last, f"{metric.replace('_', ' ')} {shown}")
    if kind is RuleKind.PREEMPTIONS:
        rates = d.rate(store, tid, "preemptions_total", grid, rule.window_s).to_numpy()
        active, last = _sustained(rates, rule.threshold)
        return Finding(active, last, f"{last or 0:.3g} preemptions/s")
    if kind in (RuleKind.TAIL_RATIO, RuleKind.P99_OVER_SLO):
        assert rule.metric is not None
        frame = quantiles(rule.metric, grid, rule.window_s)
        counts = frame["count"].to_numpy()
        if kind is RuleKind.TAIL_RATIO:
            vals = np.where(counts >= MIN_COUNT, frame["ratio"].to_numpy(), np.nan)
            active, last = _sustained(vals, rule.threshold)
            words = f"{rule.metric.upper()} p99/p50 {last or 0:.2f}"
            if rule.baseline_s is None:
                return Finding(active, last, words)
            base = quantiles(rule.metric, d.point_grid(now, rule.baseline_s), rule.baseline_s)
            usual = base["ratio"].iloc[-1] if base["count"].iloc[-1] >= MIN_COUNT else math.nan
            if math.isnan(usual):
                return Finding(False, last, f"{words}; too few requests for a baseline")
            over = _sustained(vals, rule.baseline_factor * float(usual))[0]
            return Finding(active and over, last, f"{words} against its usual {usual:.2f}")
        limit = rule.threshold if bound is None else bound
        vals = np.where(counts >= 1, frame["p99"].to_numpy(), np.nan)
        active, last = _sustained(vals, limit)
        src = "the SLO's bound" if bound is not None else "the rule's bound"
        return Finding(
            active, last, f"{rule.metric.upper()} p99 {last or 0:.3g} s against {limit:g} s ({src})"
        )
    if kind is RuleKind.KV_SLOPE:
        return _kv_slope(store, rule, tid, now)
    if kind is RuleKind.SLO_BURN:
        return _burn(store, rule, tid, now, slo)
    if kind is RuleKind.OUTPUT_TAIL:
        w = rule.window_s
        cur = quantiles("output_len", d.point_grid(now, w), w).iloc[-1]
        before = quantiles("output_len", d.point_grid(now - w, w), w).iloc[-1]
        # Written so that NaN (no histogram in a window) fails it too.
        if not (cur["count"] >= MIN_COUNT and before["count"] >= MIN_COUNT and before["p99"] > 0):
            return Finding(False, None, "too few requests to compare output lengths")
        ratio = float(cur["p99"] / before["p99"])
        return Finding(
            ratio > rule.threshold,
            ratio,
            f"p99 output length {cur['p99']:.0f} tokens, {ratio:.2f}x the "
            f"{before['p99']:.0f} of the window before",
        )
    if kind is RuleKind.TARGET_DOWN:
        since = target.last_success_at or (target.last_scrape_at or now)
        down_for = now - since
        active = target.health == "down" and down_for >= rule.for_s
        return Finding(
            active,
            down_for if target.health == "down" else 0.0,
            f"{target.health}: {target.health_message or 'answering'}",
        )
    if kind is RuleKind.ENGINE_RESTARTING:
        crashes = q.events(store, now - rule.window_s, now, target_id=tid, kinds=CRASH_EVENTS)
        return Finding(
            target.managed and len(crashes) >= rule.threshold,
            float(len(crashes)),
            f"{len(crashes)} crash(es) in the last {rule.window_s / 60:g} min",
        )
    raise KvscopeError(f"no evaluation for rule kind {kind}")


def _kv_slope(store: Engine, rule: AlertRule, tid: int, now: float) -> Finding:
    """KV usage slope over the window, only while the request rate is steady."""
    res = d.choose_resolution(rule.for_s + rule.window_s)
    fine = d.Grid(now - rule.for_s - rule.window_s, now, max(10.0, float(res)), res)
    ts = fine.points
    kv = d.gauge(store, tid, "kv_usage", fine).to_numpy()
    reqs = d.rate(store, tid, "requests_finished_total", fine, 60.0).to_numpy()
    checks = [now - rule.for_s + i * rule.for_s / 4 for i in range(5)] if rule.for_s else [now]
    slopes = []
    for t in checks:
        inside = (ts > t - rule.window_s) & (ts <= t)
        slope = _slope_per_min(ts[inside], kv[inside])
        rate = reqs[inside][~np.isnan(reqs[inside])]
        steady = bool(
            rate.size >= 3 and rate.mean() > 0 and rate.std() / rate.mean() <= rule.stable_rate
        )
        if slope is None or not steady or slope <= rule.threshold:
            return Finding(False, slope, _slope_words(slope, steady))
        slopes.append(slope)
    return Finding(True, slopes[-1], _slope_words(slopes[-1], True))


def _burn(store: Engine, rule: AlertRule, tid: int, now: float, slo: SLO | None) -> Finding:
    """Both windows burning faster than the threshold: the long one says it is serious,
    the short one that it is still going on (so the alert resolves soon after it stops)."""
    if slo is None:
        return Finding(False, None, "no SLO applies to this target: nothing to burn")
    long = burn_rate(store, tid, slo, now, rule.window_s)
    short = burn_rate(store, tid, slo, now, rule.short_window_s)
    if long is None or short is None:
        return Finding(False, long, "no requests in the window: nothing burning")
    words = (
        f"SLO {slo.name}: burn {long:.3g}x over {rule.window_s / 60:g} min, "
        f"{short:.3g}x over {rule.short_window_s / 60:g} min"
    )
    return Finding(long > rule.threshold and short > rule.threshold, long, words)


def _slope_words(slope: float | None, steady: bool) -> str:
    if slope is None:
        return "too few KV samples"
    words = f"KV usage {slope:+.1%} of the cache per minute"
    return words if steady else f"{words} (request rate not steady: not judged)"


@dataclass
class Transition:
    """What one pass changed."""

    fired: list[str]
    resolved: list[str]


class AlertEvaluator:
    """One pass over every enabled rule and every target it applies to."""

    def __init__(self, store: Engine) -> None:
        self.store = store

    def run(self, now: float | None = None) -> Transition:
        """Evaluate, then open alerts that fire and close those that stopped holding."""
        now = time.time() if now is None else now
        targets = [t for t in q.list_targets(self.store) if t.enabled or t.health == "down"]
        global_slo, target_slos = _slos(self.store)
        firing = {(a.rule_id, a.target_id): a for a in q.alerts(self.store, state="firing")}
        out = Transition([], [])
        memo: Quantiles = {}
        # A row that does not validate is skipped: the page refuses such edits, but the
        # store may hold one written by hand or by another version; the Alerts page shows it.
        for rule_id, rule in rules_from_rows(q.list_rules(self.store)).valid.items():
            scope: list[TargetRow] = (
                [t for t in targets if rule.applies_to(t)] if rule.enabled else []
            )
            for target in scope:
                if target.health == "down" and rule.kind not in ABOUT_THE_TARGET:
                    # No fresh data to judge; the target-down rule speaks for it. An alert
                    # that was firing resolves, as it would on the gap in its series.
                    finding = Finding(False, None, f"not judged: {target.name} is down")
                    if (open_alert := firing.pop((rule_id, target.id), None)) is not None:
                        message = f"{rule.name} on {target.name}: {finding.detail}"
                        q.resolve_alert(self.store, open_alert.id, f"resolved: {message}", now)
                        out.resolved.append(message)
                    continue
                slo = target_slos.get(target.id, global_slo)
                bound = None
                if rule.kind is RuleKind.P99_OVER_SLO and rule.metric and slo is not None:
                    bound = _bounds(slo).get(rule.metric)
                finding = evaluate(self.store, rule, target, now, bound, memo, slo)
                message = f"{rule.name} on {target.name}: {finding.detail}"
                open_alert = firing.pop((rule_id, target.id), None)
                value = (
                    None if finding.value is None or math.isnan(finding.value) else finding.value
                )
                if finding.active and open_alert is None:
                    q.fire_alert(self.store, rule_id, target.id, rule.severity, value, message, now)
                    out.fired.append(message)
                elif finding.active and open_alert is not None:
                    q.update_alert(self.store, open_alert.id, value, message)
                elif open_alert is not None:
                    q.resolve_alert(self.store, open_alert.id, f"resolved: {message}", now)
                    out.resolved.append(message)
        for stale in firing.values():  # its rule was disabled, or its target removed
            q.resolve_alert(
                self.store, stale.id, f"resolved: {stale.rule} no longer evaluated", now
            )
            out.resolved.append(stale.message)
        return out


def _slos(store: Engine) -> tuple[SLO | None, dict[int, SLO]]:
    """The SLOs: the global one (no target) and each target's own; a target's own wins."""
    global_: SLO | None = None
    per: dict[int, SLO] = {}
    for _, _, target_id, spec in q.list_slos(store):
        try:
            slo = parse_slo(spec)
        except KvscopeError:
            continue  # a row another version wrote; the SLOs page shows it
        if target_id is None:
            global_ = global_ or slo
        else:
            per.setdefault(target_id, slo)
    return global_, per


def _bounds(slo: SLO) -> dict[str, float]:
    """An SLO's bounds by metric: {'ttft': s, 'tpot' or 'itl': s}."""
    return {"ttft": slo.ttft_s, slo.per_token: slo.tpot_s}
