"""Why the tail broke: one window's signals in, the dominant cause and its evidence out.

The causes are a fixed vocabulary (`Cause`). Each is scored from 0 to 1 by what the engine
itself reports over the window (its gauges, counters and histograms, as kvscope stores
them); a score of `BAR` or more means "this alone is enough to hurt the tail". The cause
with the highest score is the verdict, the next one the runner-up; ties go to the cause
that explains the others (an engine that is down also fails requests and queues them).
When the window is known to be degraded (an SLO broken, or p99 well above its own
baseline), a weaker cause is named rather than none, since something did break.

Pure: no I/O. `storage/dashboards/diagnosis.py` turns stored series into `Signals`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum


class Cause(StrEnum):
    """What broke the tail, in order of precedence for ties."""

    DOWN = "down"
    ERRORS = "errors"
    KV_PRESSURE = "kv_pressure"
    QUEUEING = "queueing"
    PREFILL_INTERFERENCE = "prefill_interference"
    DECODE_SLOWDOWN = "decode_slowdown"
    NONE = "none"


EXPLAINS: dict[Cause, str] = {
    Cause.DOWN: "the target did not answer its scrapes, or the engine restarted",
    Cause.ERRORS: "requests ended aborted or failed",
    Cause.KV_PRESSURE: "the KV cache was full: requests were preempted or waited for blocks",
    Cause.QUEUEING: "requests waited in the queue for most of their time to first token",
    Cause.PREFILL_INTERFERENCE: (
        "long prompts in the mix held up everyone's next token (head-of-line blocking)"
    ),
    Cause.DECODE_SLOWDOWN: "each output token took longer as the batch grew",
    Cause.NONE: "nothing in the engine's signals explains a worse tail",
}

# A score at the bar is enough to name a cause on its own.
BAR = 0.5
# In a window known to be degraded, a cause this strong is named (something did break).
DEGRADED_BAR = 0.2
# The tail counts as degraded at this multiple of its own baseline p99.
BASELINE_FACTOR = 2.0

KV_FULL = 0.9  # KV usage at which vLLM is about to run out of blocks
WAITING_MIN = 0.5  # mean waiting requests over the window that count as a queue
ERRORS_BAR_SHARE = 0.05  # the share of failed requests at which errors reach the bar
PROMPT_SPREAD = 4.0  # prompt-length p99 over p50 that says long prompts are in the mix
# ITL p99 over p50 at which tokens stall behind something (a quiet CPU engine shows 4).
ITL_SPIKE = 8.0
# TTFT p99 over p50 with long prompts in the mix: short requests stuck behind long
# prefills (a request that arrives during a prefill step waits outside vLLM's queue, so
# its wait shows in TTFT and not in queue time).
TTFT_SPIKE = 10.0
SLOWDOWN = 1.5  # TPOT and batch size, each against its baseline


@dataclass(frozen=True, slots=True)
class Baseline:
    """The target's own usual tail, from a period before the window."""

    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    tpot_p50_s: float | None = None
    running_mean: float | None = None


@dataclass(frozen=True, slots=True)
class Signals:
    """What the engine reported over one window [start, end] (None: not exposed or no data)."""

    start: float
    end: float
    up_share: float | None = None  # time-weighted share of scrapes that answered
    restarts: int = 0  # engine crashes and restarts seen in the window
    finished: float = 0.0  # requests finished (any reason)
    failed: float = 0.0  # requests finished aborted or with an error
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    tpot_p50_s: float | None = None
    ttft_mean_s: float | None = None
    queue_mean_s: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    running_mean: float | None = None
    kv_mean: float | None = None
    kv_max: float | None = None
    preemptions: float = 0.0
    prompt_p50: float | None = None
    prompt_p99: float | None = None
    prompt_mean: float | None = None
    kv_capacity_tokens: float | None = None  # the engine's KV blocks x block size
    slo_violated: bool | None = None  # None: no SLO applies

    @property
    def window_s(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Evidence:
    """One series and its value over the window, and what it says."""

    series: str
    value: float
    note: str


@dataclass(frozen=True, slots=True)
class Score:
    """How strongly the window's signals point at one cause."""

    cause: Cause
    score: float
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """The dominant cause of one window, its evidence, and the runner-up."""

    start: float
    end: float
    cause: Cause
    score: float
    evidence: tuple[Evidence, ...]
    runner_up: Cause
    runner_up_score: float
    degraded: bool | None  # the tail was worse than promised or usual; None: unknown
    context: tuple[Evidence, ...] = field(default=())
    slo_violated: bool | None = None  # None: no SLO applies

    @property
    def window_s(self) -> float:
        return self.end - self.start

    @property
    def explanation(self) -> str:
        return EXPLAINS[self.cause]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b > 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


def _standing_queue(s: Signals) -> float | None:
    """The mean waiting when scrapes saw a standing queue (which queueing can claim)."""
    w = s.waiting_mean
    return w if w is not None and w >= WAITING_MIN else None


def _serving_a_queue(s: Signals) -> bool:
    """The engine finished requests without failures while holding a queue: it was up, and
    busy enough that its metrics endpoint may be slow to answer."""
    return (
        _standing_queue(s) is not None
        and s.finished > 0
        and s.failed / s.finished < ERRORS_BAR_SHARE
    )


def _down(s: Signals) -> Score:
    ev = []
    score = 0.0
    if s.up_share is not None and s.up_share < 1.0:
        # A tenth of the window unanswered is at the bar.
        score = _clamp((1.0 - s.up_share) * 5.0)
        ev.append(Evidence("up", s.up_share, "share of the window the target answered scrapes"))
        if _serving_a_queue(s):
            # Scrapes that timed out while requests kept finishing say the endpoint was
            # slow under load, not gone (seen beside a CPU hog: a fifth of the scrapes of a
            # saturated CPU engine unanswered, every request served): they count half.
            score /= 2
            ev.append(
                Evidence("finished", s.finished, "requests finished, none failed, a queue held")
            )
    if s.restarts:
        score = 1.0
        ev.append(Evidence("engine restarts", s.restarts, "the engine crashed or restarted"))
    return Score(Cause.DOWN, score, tuple(ev))


def _errors(s: Signals) -> Score:
    total = s.finished
    if total <= 0 or s.failed <= 0:
        return Score(Cause.ERRORS, 0.0)
    share = s.failed / total
    return Score(
        Cause.ERRORS,
        _clamp(share * 0.5 / ERRORS_BAR_SHARE),  # at the bar from ERRORS_BAR_SHARE
        (
            Evidence("requests failed", s.failed, "finished aborted or with an error"),
            Evidence("failed share", share, f"of {total:.0f} requests finished"),
        ),
    )


def _queue_share(s: Signals) -> float | None:
    share = _ratio(s.queue_mean_s, s.ttft_mean_s)
    return None if share is None else min(share, 1.0)


def _headroom(s: Signals) -> float | None:
    """Free KV at the fullest moment, in typical prompts: below 1 the next request waits."""
    if s.kv_max is None or s.kv_capacity_tokens is None or not s.prompt_mean:
        return None
    return (1.0 - s.kv_max) * s.kv_capacity_tokens / s.prompt_mean


def _kv_short(s: Signals) -> bool:
    """Blocks ran out: vLLM preempted, the cache was near full, or had no room for the next
    typical prompt (vLLM admits a request only when its prompt's blocks are free)."""
    room = _headroom(s)
    return (
        s.preemptions > 0
        or (s.kv_max is not None and s.kv_max >= KV_FULL)
        or (room is not None and room < 1.0)
    )


def _kv_pressure(s: Signals) -> Score:
    if not _kv_short(s):
        return Score(Cause.KV_PRESSURE, 0.0)
    ev = []
    if s.kv_max is not None:
        ev.append(Evidence("kv_usage max", s.kv_max, "the fullest the cache was"))
    room = _headroom(s)
    if room is not None:
        ev.append(Evidence("free KV in prompts", room, "free blocks then, in typical prompts"))
    score = 0.3  # short of blocks, but nobody is shown to suffer for it yet
    if s.preemptions > 0:
        per = s.preemptions / max(s.finished, 1.0)
        score = max(score, 0.6 + 0.4 * _clamp(per))
        ev.append(Evidence("preemptions", s.preemptions, "requests evicted to free blocks"))
    if (waiting := _standing_queue(s)) is not None:
        # Requests wait while the cache has no room: they wait for blocks.
        score = max(score, 0.6, _queue_share(s) or 0.0)
        ev.append(Evidence("waiting mean", waiting, "requests waiting for blocks"))
    if s.kv_mean is not None:
        ev.append(Evidence("kv_usage mean", s.kv_mean, "over the window"))
    return Score(Cause.KV_PRESSURE, score, tuple(ev))


def _queueing(s: Signals) -> Score:
    share = _queue_share(s)
    waiting = _standing_queue(s)
    if share is None or waiting is None:
        return Score(Cause.QUEUEING, 0.0)
    ev = [
        Evidence("queue share of TTFT", share, "mean queue time over mean TTFT"),
        Evidence("waiting mean", waiting, "requests waiting, mean over the window"),
    ]
    if s.queue_mean_s is not None:
        ev.append(Evidence("queue_time mean s", s.queue_mean_s, "per request"))
    # With the cache full the queue is waiting for blocks: that is KV pressure's share.
    score = share * (0.5 if _kv_short(s) else 1.0)
    return Score(Cause.QUEUEING, score, tuple(ev))


def _prefill_interference(s: Signals) -> Score:
    spread = _ratio(s.prompt_p99, s.prompt_p50)
    if spread is None or spread < PROMPT_SPREAD:
        return Score(Cause.PREFILL_INTERFERENCE, 0.0)
    ev = [Evidence("prompt_len p99/p50", spread, "long prompts among short ones")]
    stall = 0.0
    itl = _ratio(s.itl_p99_s, s.itl_p50_s)
    if itl is not None:
        stall = max(stall, itl / ITL_SPIKE)
        ev.append(Evidence("itl p99/p50", itl, "everyone's token gaps: the slowest against usual"))
    ttft = _ratio(s.ttft_p99_s, s.ttft_p50_s)
    if ttft is not None:
        stall = max(stall, ttft / TTFT_SPIKE)
        ev.append(Evidence("ttft p99/p50", ttft, "first tokens: the slowest against usual"))
    # At the spike threshold the score is at the bar; at 4 x the threshold it is certain.
    score = _clamp(0.5 + 0.5 * math.log(stall, 4.0)) if stall > 0 else 0.0
    share = _queue_share(s)
    if share is not None and share > 0.5 and _standing_queue(s) is not None:
        score *= 1.0 - share  # the stall is the standing queue's doing, not the prefills'
    return Score(Cause.PREFILL_INTERFERENCE, score, tuple(ev))


def _decode_slowdown(s: Signals, base: Baseline | None) -> Score:
    if base is None:
        return Score(Cause.DECODE_SLOWDOWN, 0.0)
    tpot = _ratio(s.tpot_p50_s, base.tpot_p50_s)
    batch = _ratio(s.running_mean, base.running_mean)
    if tpot is None or batch is None or tpot < 1.0 or batch < SLOWDOWN:
        return Score(Cause.DECODE_SLOWDOWN, 0.0)
    share = _queue_share(s) or 0.0
    # TPOT at SLOWDOWN x its baseline with a grown batch is at the bar.
    score = _clamp(0.5 * (tpot - 1.0) / (SLOWDOWN - 1.0)) * (1.0 - share)
    return Score(
        Cause.DECODE_SLOWDOWN,
        score,
        (
            Evidence("tpot p50 / baseline", tpot, "time per output token against usual"),
            Evidence("running / baseline", batch, "batch size against usual"),
        ),
    )


def degraded(s: Signals, base: Baseline | None) -> tuple[bool | None, tuple[Evidence, ...]]:
    """Whether the window's tail was worse than promised (SLO) or than usual (baseline)."""
    ev: list[Evidence] = []
    verdicts: list[bool] = []
    if s.slo_violated is not None:
        verdicts.append(s.slo_violated)
        ev.append(Evidence("slo violated", float(s.slo_violated), "the SLO over the window"))
    if base is not None:
        for name, now, usual in (
            ("ttft p99 / baseline", s.ttft_p99_s, base.ttft_p99_s),
            ("itl p99 / baseline", s.itl_p99_s, base.itl_p99_s),
        ):
            r = _ratio(now, usual)
            if r is not None:
                verdicts.append(r >= BASELINE_FACTOR)
                ev.append(Evidence(name, r, f"worse at {BASELINE_FACTOR:g}x its own baseline"))
    return (any(verdicts) if verdicts else None), tuple(ev)


def scores(s: Signals, base: Baseline | None = None) -> list[Score]:
    """Every cause's score, strongest first (ties in precedence order)."""
    order = list(Cause)
    found = [
        _down(s),
        _errors(s),
        _kv_pressure(s),
        _queueing(s),
        _prefill_interference(s),
        _decode_slowdown(s, base),
    ]
    return sorted(found, key=lambda x: (-round(x.score, 6), order.index(x.cause)))


def judge(s: Signals, base: Baseline | None = None) -> Verdict:
    """The dominant cause of the window, its evidence and the runner-up."""
    ranked = scores(s, base)
    worse, context = degraded(s, base)
    bar = DEGRADED_BAR if worse else BAR
    named = [x for x in ranked if x.score >= bar]
    top = named[0] if named else Score(Cause.NONE, 0.0)
    rest = [x for x in ranked if x.cause is not top.cause and x.score > 0]
    second = rest[0] if rest else Score(Cause.NONE, 0.0)
    return Verdict(
        start=s.start,
        end=s.end,
        cause=top.cause,
        score=round(top.score, 3),
        evidence=top.evidence,
        runner_up=second.cause,
        runner_up_score=round(second.score, 3),
        degraded=worse,
        context=context,
        slo_violated=s.slo_violated,
    )
