"""Diagnosis over stored data: each window's signals read from the store, judged by
`planner.diagnosis`, for the Overview, SLOs and Tail pages and `kvscope diagnose`.

Windows end on a grid `window_s` apart; every signal is taken over its window only
(histogram and counter increases, time-weighted gauge means and peaks). The baseline is
the target's own tail over the hour before the first window.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
from pydantic import BaseModel
from sqlalchemy import Engine

from planner import diagnosis as dx
from planner import slo as slo_math
from storage import derived as d
from storage import queries as q

DEFAULT_WINDOW_S = 300.0
BASELINE_S = 3600.0
MAX_WINDOWS = 288
# Engine events that mean it was not serving for part of the window.
RESTART_EVENTS = ("engine_crashed", "engine_failed", "engine_starting", "engine_killed")
FAILED_REASONS = frozenset({"abort", "error"})


class EvidenceOut(BaseModel):
    """One series, its value over the window, and what it says."""

    series: str
    value: float
    note: str


class VerdictOut(BaseModel):
    """One window's verdict, as pages and `kvscope diagnose --json` show it."""

    start: float
    end: float
    window_s: float
    cause: str
    score: float
    explanation: str
    evidence: list[EvidenceOut]
    runner_up: str
    runner_up_score: float
    degraded: bool | None
    context: list[EvidenceOut]
    slo_violated: bool | None

    @property
    def summary(self) -> str:
        """The evidence in one line: 'queue share of TTFT 0.97, waiting mean 74'."""
        return ", ".join(f"{e.series} {e.value:.3g}" for e in self.evidence)

    @classmethod
    def of(cls, v: dx.Verdict) -> VerdictOut:
        def out(items: tuple[dx.Evidence, ...]) -> list[EvidenceOut]:
            return [
                EvidenceOut(series=e.series, value=round(e.value, 6), note=e.note) for e in items
            ]

        return cls(
            start=v.start,
            end=v.end,
            window_s=v.window_s,
            cause=v.cause.value,
            score=v.score,
            explanation=v.explanation,
            evidence=out(v.evidence),
            runner_up=v.runner_up.value,
            runner_up_score=v.runner_up_score,
            degraded=v.degraded,
            context=out(v.context),
            slo_violated=v.slo_violated,
        )


class Diagnosis(BaseModel):
    """A target's windows over a period, and the verdict of the worst one."""

    target: str
    start: float
    end: float
    window_s: float
    cause: str
    evidence: list[EvidenceOut]
    runner_up: str
    explanation: str
    worst: VerdictOut | None
    windows: list[VerdictOut]


def _num(x: object) -> float | None:
    if x is None:
        return None
    f = float(x)  # type: ignore[arg-type]
    return None if math.isnan(f) else f


def _grid(start: float, end: float, window_s: float) -> d.Grid:
    if window_s <= 0:
        raise ValueError("a diagnosis window must be positive")
    span = end - start
    if span < window_s:
        window_s = span
    n = min(MAX_WINDOWS, max(1, math.floor(span / window_s + 1e-9)))
    window_s = max(window_s, span / n)
    return d.Grid(end - window_s * (n - 1), end, window_s, d.choose_resolution(window_s))


def _mean(store: Engine, tid: int, h: str, grid: d.Grid) -> np.ndarray:
    total = d.increase(store, tid, f"{h}_sum", grid, grid.step).to_numpy()
    count = d.increase(store, tid, f"{h}_count", grid, grid.step).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(count > 0, total / count, np.nan)


def _restarts(store: Engine, tid: int, times: np.ndarray, w: float) -> np.ndarray:
    found = q.events(store, times[0] - w, times[-1], target_id=tid, kinds=RESTART_EVENTS)
    ts = np.array([e.ts for e in found])
    return np.array([int(((ts > t - w) & (ts <= t)).sum()) for t in times])


def _slo_violated(store: Engine, tid: int, grid: d.Grid) -> list[bool | None]:
    """Per window: is any SLO that applies to the target broken (by the histograms'
    pessimistic bound, as the alerts judge it)? None where no SLO applies or no request
    finished."""
    slos = [slo_math.parse_slo(spec) for _, _, t, spec in q.list_slos(store) if t in (None, tid)]
    out: list[bool | None] = [None] * len(grid.points)
    if not slos:
        return out
    buckets = {
        h: d.bucket_increases(store, tid, h, grid, grid.step)
        for h in {"ttft", *(slo.per_token for slo in slos)}
    }
    for slo in slos:
        (t_les, t_counts), (k_les, k_counts) = buckets["ttft"], buckets[slo.per_token]
        if not len(t_les) or not len(k_les):
            continue
        for i in range(len(out)):
            ttft = list(zip(t_les.tolist(), t_counts[i].tolist(), strict=True))
            tok = list(zip(k_les.tolist(), k_counts[i].tolist(), strict=True))
            if np.isnan(t_counts[i]).any() or np.isnan(k_counts[i]).any():
                continue
            hist = slo_math.compliance_from_histograms(ttft, tok, slo)
            if hist.requests:
                out[i] = bool(out[i]) or hist.lower < slo.share
    return out


def signals(
    store: Engine, target_id: int, start: float, end: float, window_s: float
) -> list[dx.Signals]:
    """The signals of each window of `window_s` ending at `end`, back to `start`."""
    grid = _grid(start, end, window_s)
    w, times = grid.step, grid.points
    qs = (0.5, 0.99)

    def quant(h: str) -> pd.DataFrame:
        return d.quantiles(store, target_id, h, grid, w, qs)

    ttft, itl, tpot, prompt = quant("ttft"), quant("itl"), quant("tpot"), quant("prompt_len")
    ttft_mean = _mean(store, target_id, "ttft", grid)
    queue_mean = _mean(store, target_id, "queue_time", grid)
    prompt_mean = _mean(store, target_id, "prompt_len", grid)
    row = q.get_target(store, target_id)
    capacity = (
        float(row.num_gpu_blocks * row.block_size)
        if row.num_gpu_blocks and row.block_size
        else None
    )
    gauges = {
        m: d.gauge_window(store, target_id, m, grid, w)
        for m in ("up", "waiting", "running", "kv_usage")
    }
    finished = d.increase(store, target_id, "requests_finished_total", grid, w).to_numpy()
    failed = d.increase(
        store,
        target_id,
        "requests_finished_total",
        grid,
        w,
        keep=lambda labels: labels.get("finished_reason") in FAILED_REASONS,
    ).to_numpy()
    preempt = d.increase(store, target_id, "preemptions_total", grid, w).to_numpy()
    restarts = _restarts(store, target_id, times, w)
    violated = _slo_violated(store, target_id, grid)
    out = []
    for i, t in enumerate(times):
        out.append(
            dx.Signals(
                start=float(t - w),
                end=float(t),
                up_share=_num(gauges["up"]["mean"].iloc[i]),
                restarts=int(restarts[i]),
                finished=_num(finished[i]) or 0.0,
                failed=_num(failed[i]) or 0.0,
                ttft_p50_s=_num(ttft["p50"].iloc[i]),
                ttft_p99_s=_num(ttft["p99"].iloc[i]),
                itl_p50_s=_num(itl["p50"].iloc[i]),
                itl_p99_s=_num(itl["p99"].iloc[i]),
                tpot_p50_s=_num(tpot["p50"].iloc[i]),
                ttft_mean_s=_num(ttft_mean[i]),
                queue_mean_s=_num(queue_mean[i]),
                waiting_mean=_num(gauges["waiting"]["mean"].iloc[i]),
                waiting_max=_num(gauges["waiting"]["max"].iloc[i]),
                running_mean=_num(gauges["running"]["mean"].iloc[i]),
                kv_mean=_num(gauges["kv_usage"]["mean"].iloc[i]),
                kv_max=_num(gauges["kv_usage"]["max"].iloc[i]),
                preemptions=_num(preempt[i]) or 0.0,
                prompt_p50=_num(prompt["p50"].iloc[i]),
                prompt_p99=_num(prompt["p99"].iloc[i]),
                prompt_mean=_num(prompt_mean[i]),
                kv_capacity_tokens=capacity,
                slo_violated=violated[i],
            )
        )
    return out


def baseline(
    store: Engine, target_id: int, before: float, span_s: float = BASELINE_S
) -> dx.Baseline | None:
    """The target's usual tail over `span_s` before `before`; None without requests there."""
    (s,) = signals(store, target_id, before - span_s, before, span_s)
    if not s.finished and s.ttft_p99_s is None:
        return None
    return dx.Baseline(
        ttft_p99_s=s.ttft_p99_s,
        itl_p99_s=s.itl_p99_s,
        tpot_p50_s=s.tpot_p50_s,
        running_mean=s.running_mean,
    )


def verdicts(
    store: Engine,
    target_id: int,
    start: float,
    end: float,
    window_s: float = DEFAULT_WINDOW_S,
    use_baseline: bool = True,
) -> list[dx.Verdict]:
    """Each window's verdict, oldest first."""
    base = baseline(store, target_id, start) if use_baseline else None
    return [dx.judge(s, base) for s in signals(store, target_id, start, end, window_s)]


def summarize(name: str, found: list[dx.Verdict]) -> Diagnosis:
    """The period's verdict: that of its strongest problem window (none if there is none)."""
    problems = [v for v in found if v.cause is not dx.Cause.NONE]
    order = list(dx.Cause)
    worst = min(problems, key=lambda v: (-v.score, order.index(v.cause), -v.end), default=None)
    shown = worst or (found[-1] if found else None)
    shown_worst = VerdictOut.of(worst) if worst else None
    start = found[0].start if found else 0.0
    end = found[-1].end if found else 0.0
    return Diagnosis(
        target=name,
        start=start,
        end=end,
        window_s=found[0].window_s if found else 0.0,
        cause=(worst.cause if worst else dx.Cause.NONE).value,
        evidence=shown_worst.evidence if shown_worst else [],
        runner_up=(shown.runner_up if shown else dx.Cause.NONE).value,
        explanation=dx.EXPLAINS[worst.cause if worst else dx.Cause.NONE],
        worst=shown_worst,
        windows=[VerdictOut.of(v) for v in found],
    )


def diagnose(
    store: Engine,
    target: str | int,
    since_s: float = 3600.0,
    window_s: float = DEFAULT_WINDOW_S,
    now: float | None = None,
    use_baseline: bool = True,
) -> Diagnosis:
    """A stored target's last `since_s`, window by window."""
    now = time.time() if now is None else now
    row = q.get_target(store, target)
    found = verdicts(store, row.id, now - since_s, now, window_s, use_baseline)
    return summarize(row.name, found)


class Problem(BaseModel):
    """A target whose latest window names a cause (the Overview's "why")."""

    target: str
    verdict: VerdictOut


def open_problems(
    store: Engine, window_s: float = DEFAULT_WINDOW_S, now: float | None = None
) -> list[Problem]:
    """Every target whose last `window_s` names a cause, strongest first."""
    now = time.time() if now is None else now
    out = []
    for t in q.list_targets(store):
        found = diagnose(store, t.id, window_s, window_s, now)
        if found.worst is not None:
            out.append(Problem(target=t.name, verdict=found.worst))
    return sorted(out, key=lambda p: -p.verdict.score)


def violation_windows(
    store: Engine, since_s: float, window_s: float = DEFAULT_WINDOW_S, now: float | None = None
) -> list[Problem]:
    """Every window of the last `since_s` in which an SLO on a target was broken, with its
    cause (the SLOs page), newest first."""
    now = time.time() if now is None else now
    slos = q.list_slos(store)
    if not slos:
        return []
    out = []
    scoped = {target_id for _, _, target_id, _ in slos}
    for t in q.list_targets(store):
        if None not in scoped and t.id not in scoped:
            continue
        found = diagnose(store, t.id, since_s, window_s, now)
        out += [Problem(target=t.name, verdict=w) for w in found.windows if w.slo_violated]
    return sorted(out, key=lambda p: -p.verdict.end)
