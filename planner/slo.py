"""SLO promises and how well they are kept: exact from request records, bounded from buckets.

An `SLO` is a TTFT bound, a per-token bound (TPOT or ITL) and the share of requests that
must be inside both over a window. Compliance comes two ways: `compliance_from_records`
(exact, per request) and `compliance_from_histograms` (the engine's cumulative buckets only
bound the share, see `BoundShare`). `error_budget` turns bad/total counts into budget spent
and burn rate. Presets from MLPerf Inference live in data/slo_presets.toml, each cited.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import InvalidInput, UnknownChoice, validation_message

PerToken = Literal["tpot", "itl"]
RequestClass = Literal["interactive", "batch"]
Buckets = Sequence[tuple[float, float]]

# A bound within this relative distance of a bucket edge is read as sitting on the edge:
# 0.1 typed in a form and 100 ms / 1000 should both hit vLLM's 0.1 edge.
EDGE_RTOL = 1e-9


class SLO(BaseModel):
    """A latency promise: TTFT and per-token bounds, the share that must meet both, a window."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", str_strip_whitespace=True, allow_inf_nan=False
    )

    name: str = Field(min_length=1, max_length=100)
    ttft_s: float = Field(gt=0, description="time to first token bound, seconds")
    tpot_s: float = Field(gt=0, description="per-token bound (TPOT or ITL), seconds")
    per_token: PerToken = Field("tpot", description="what tpot_s bounds: tpot or itl")
    share: float = Field(
        gt=0, le=1, description="share of requests inside both bounds, 0.99 for p99"
    )
    window_s: float = Field(gt=0, le=400 * 86400, description="compliance window, seconds")
    request_class: RequestClass = "interactive"
    source: str = Field("", max_length=2000, description="where the figures come from")

    @property
    def allowance(self) -> float:
        """The share of requests allowed outside the bounds (the error budget, 1 - share)."""
        # Rounded so that 1 - 0.99 is 0.01, not 0.010000000000000009.
        return round(1.0 - self.share, 12)

    def describe(self) -> str:
        """The promise in words: '99% of interactive requests over 10 min: TTFT <= 2 s and
        TPOT <= 100 ms'."""
        return (
            f"{self.share * 100:g}% of {self.request_class} requests over "
            f"{_span(self.window_s)}: TTFT <= {_secs(self.ttft_s)} and "
            f"{self.per_token.upper()} <= {_secs(self.tpot_s)}"
        )


def _secs(s: float) -> str:
    return f"{s:g} s" if s >= 1 else f"{s * 1000:g} ms"


def _span(s: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size and s % size == 0:
            return f"{s / size:g} {unit}"
    return f"{s:g} s"


def parse_slo(data: Mapping[str, Any]) -> SLO:
    """Validate an SLO from a form or the store; InvalidInput names every bad field."""
    try:
        return SLO.model_validate(dict(data))
    except ValidationError as err:
        raise InvalidInput(f"SLO refused: {validation_message(err)}") from err


@cache
def _presets() -> dict[str, SLO]:
    text = (Path(__file__).resolve().parent / "data" / "slo_presets.toml").read_text("utf-8")
    out: dict[str, SLO] = {}
    for row in tomllib.loads(text)["preset"]:
        fields = {k: row[k] for k in SLO.model_fields if k in row}
        out[str(row["key"])] = parse_slo(fields)
    return out


def slo_presets() -> dict[str, SLO]:
    """MLPerf Inference presets by key (e.g. 'mlperf-server-llama-3.1-8b'), each cited."""
    return dict(_presets())


def get_preset(key: str) -> SLO:
    """One preset by key; UnknownChoice lists the valid keys."""
    found = _presets().get(key.strip().lower())
    if found is None:
        raise UnknownChoice("SLO preset", key, _presets())
    return found


# ---------------------------------------------------------------------------------------
# Compliance from request records (exact)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Compliance:
    """Exact compliance of a set of requests; shares are NaN when there are no requests."""

    slo: SLO
    total: int
    inside: int
    outside: int
    errors: int
    share: float
    ttft_share: float
    per_token_share: float

    @property
    def meets(self) -> bool | None:
        """True when the inside share reaches the SLO's share; None without requests."""
        return None if self.total == 0 else self.share >= self.slo.share

    @property
    def bad(self) -> int:
        """Requests that spend error budget (outside either bound, or failed)."""
        return self.outside


def _checked(values: Sequence[float | None], what: str) -> list[float | None]:
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is not None and (math.isnan(v) or v < 0):
            raise InvalidInput(f"{what}[{i}] must be a non-negative number of seconds, got {v}")
        out.append(v)
    return out


def compliance_from_records(
    ttfts: Sequence[float | None],
    tpots: Sequence[float | None],
    ok_flags: Sequence[bool],
    slo: SLO,
) -> Compliance:
    """Count requests inside both bounds, one value per request (seconds).

    A failed request (ok False) is outside. A missing TTFT (no first token seen) is outside
    the TTFT bound; a missing per-token value (a one-token answer) cannot break the per-token
    bound. For per_token='itl' pass each request's largest gap; for 'tpot' its mean.
    """
    n = len(ok_flags)
    if len(ttfts) != n or len(tpots) != n:
        raise InvalidInput(
            f"one TTFT, one {slo.per_token.upper()} and one ok flag per request: got "
            f"{len(ttfts)}, {len(tpots)} and {n}"
        )
    ttft_v = _checked(ttfts, "ttfts")
    tok_v = _checked(tpots, "tpots")
    inside = ttft_in = tok_in = errors = 0
    for ok, t, p in zip(ok_flags, ttft_v, tok_v, strict=True):
        if not ok:
            errors += 1
            continue
        a = t is not None and t <= slo.ttft_s
        b = p is None or p <= slo.tpot_s
        ttft_in += a
        tok_in += b
        inside += a and b
    nan = math.nan
    return Compliance(
        slo=slo,
        total=n,
        inside=inside,
        outside=n - inside,
        errors=errors,
        share=inside / n if n else nan,
        ttft_share=ttft_in / n if n else nan,
        per_token_share=tok_in / n if n else nan,
    )


# ---------------------------------------------------------------------------------------
# Compliance from engine histograms (bucket-bounded)
# ---------------------------------------------------------------------------------------


def _cumulative(buckets: Buckets, what: str) -> tuple[list[float], list[float]]:
    pairs = sorted((float(le), float(c)) for le, c in buckets)
    if len(pairs) < 1 or not math.isinf(pairs[-1][0]):
        raise InvalidInput(f"{what} histogram needs its +Inf bucket (the total count)")
    les = [le for le, _ in pairs]
    if len(set(les)) != len(les):
        raise InvalidInput(f"{what} histogram has the same bucket edge twice")
    counts: list[float] = []
    for _, c in pairs:
        if math.isnan(c) or c < 0:
            raise InvalidInput(f"{what} histogram has a negative or missing count: {c}")
        # Scrape races can make a cumulative count dip; it never really falls.
        counts.append(max(c, counts[-1]) if counts else c)
    return les, counts


def histogram_delta(later: Buckets, earlier: Buckets) -> list[tuple[float, float]]:
    """Observations between two scrapes of one cumulative histogram (the window's buckets).

    When any bucket fell, the engine restarted in between and `later` alone is returned
    (the counts since the restart), as Prometheus' increase() treats a counter reset.
    """
    les_l, c_l = _cumulative(later, "later")
    les_e, c_e = _cumulative(earlier, "earlier")
    if les_l != les_e:
        raise InvalidInput("the two scrapes have different bucket edges; compare like with like")
    if any(b < a for a, b in zip(c_e, c_l, strict=True)):
        return list(zip(les_l, c_l, strict=True))
    return [(le, b - a) for le, a, b in zip(les_l, c_e, c_l, strict=True)]


@dataclass(frozen=True, slots=True)
class BoundShare:
    """What cumulative buckets say about the share of observations <= one bound.

    Buckets only count observations up to each edge, so with edges e1 <= bound <= e2 the
    share lies in [count(<= e1), count(<= e2)] / n; it is exact when the bound is an edge.
    """

    bound_s: float
    observations: float
    lower: float
    upper: float
    edge_below: float | None
    edge_above: float
    on_edge: bool

    @property
    def exact(self) -> bool:
        """True when the buckets pin the share down (bound on an edge, or an empty gap)."""
        return self.lower == self.upper


def bound_share(buckets: Buckets, bound_s: float, what: str = "latency") -> BoundShare:
    """Lower and upper share of observations <= bound_s from cumulative (le, count) pairs."""
    if not bound_s > 0 or math.isinf(bound_s):
        raise InvalidInput(f"{what} bound must be a positive number of seconds, got {bound_s}")
    les, counts = _cumulative(buckets, what)
    n = counts[-1]
    below_count, edge_below = 0.0, None
    above_count, edge_above = n, math.inf
    on_edge = False
    for le, c in zip(les, counts, strict=True):
        if math.isclose(le, bound_s, rel_tol=EDGE_RTOL):
            below_count = above_count = c
            edge_below = edge_above = le
            on_edge = True
            break
        if le < bound_s:
            below_count, edge_below = c, le
        else:
            above_count, edge_above = c, le
            break
    if n <= 0:
        return BoundShare(bound_s, 0.0, math.nan, math.nan, edge_below, edge_above, on_edge)
    return BoundShare(bound_s, n, below_count / n, above_count / n, edge_below, edge_above, on_edge)


def frechet_bounds(a: float, b: float) -> tuple[float, float]:
    """Bounds on P(A and B) knowing only P(A) = a and P(B) = b: max(0, a+b-1) .. min(a, b)."""
    return max(0.0, a + b - 1.0), min(a, b)


HistogramLabel = Literal["exact", "exact per bound, joint bounded", "bucket-bounded"]


@dataclass(frozen=True, slots=True)
class HistogramCompliance:
    """Compliance read off the engine's histograms: a range [lower, upper], not one number.

    The engine keeps TTFT and the per-token latency in two separate histograms, so which
    requests are inside both is unknown; with a share a inside one bound and b inside the
    other, the joint share lies in Fréchet's [max(0, a+b-1), min(a, b)]. Bounds that fall
    between bucket edges widen a and b into ranges too.
    """

    slo: SLO
    ttft: BoundShare
    per_token: BoundShare
    requests: float
    failed: float
    ttft_share: tuple[float, float]
    per_token_share: tuple[float, float]
    lower: float
    upper: float
    label: HistogramLabel
    notes: tuple[str, ...] = ()

    @property
    def exact_per_bound(self) -> bool:
        """True when both bounds sit on bucket edges (each bound's own share is exact)."""
        return self.ttft.on_edge and self.per_token.on_edge

    @property
    def meets(self) -> bool | None:
        """True if even the lower bound meets the SLO, False if even the upper misses it."""
        if math.isnan(self.lower):
            return None
        if self.lower >= self.slo.share:
            return True
        if self.upper < self.slo.share:
            return False
        return None


def compliance_from_histograms(
    ttft_buckets: Buckets,
    per_token_buckets: Buckets,
    slo: SLO,
    failed: float = 0.0,
) -> HistogramCompliance:
    """Bounds on the share of requests inside both SLO bounds, from two histograms.

    Pass the window's buckets (`histogram_delta` of two scrapes). Every request with a first
    token is in the TTFT histogram; `failed` requests (no first token) count outside. TPOT
    requests missing from their histogram (one-token answers) count inside the TPOT bound.
    """
    if math.isnan(failed) or failed < 0:
        raise InvalidInput(f"failed requests must be a count >= 0, got {failed}")
    ttft = bound_share(ttft_buckets, slo.ttft_s, "TTFT")
    tok = bound_share(per_token_buckets, slo.tpot_s, slo.per_token.upper())
    notes: list[str] = []
    requests = ttft.observations + failed
    if requests <= 0:
        nan = math.nan
        return HistogramCompliance(
            slo=slo,
            ttft=ttft,
            per_token=tok,
            requests=0.0,
            failed=failed,
            ttft_share=(nan, nan),
            per_token_share=(nan, nan),
            lower=nan,
            upper=nan,
            label="bucket-bounded",
            notes=("no requests in the window",),
        )
    a = (
        ttft.lower * ttft.observations / requests if ttft.observations else 0.0,
        ttft.upper * ttft.observations / requests if ttft.observations else 0.0,
    )
    n_tok = tok.observations
    if slo.per_token == "itl":
        # The ITL histogram counts gaps between tokens, not requests.
        b = (tok.lower, tok.upper) if n_tok else (1.0, 1.0)
        b = (b[0] * ttft.observations / requests, b[1] * ttft.observations / requests)
        notes.append(
            "ITL buckets count token gaps, not requests: the per-token share is a share of "
            "gaps, read as if it were a share of requests (a rough reading)"
        )
    elif n_tok <= ttft.observations:
        missing = ttft.observations - n_tok
        lo = tok.lower * n_tok if n_tok else 0.0
        hi = tok.upper * n_tok if n_tok else 0.0
        b = ((lo + missing) / requests, (hi + missing) / requests)
    else:
        b = (tok.lower * ttft.observations / requests, tok.upper * ttft.observations / requests)
        notes.append(
            f"{n_tok:g} TPOT observations against {ttft.observations:g} TTFT ones: requests "
            "that straddle the window's edges; each histogram is read on its own"
        )
    lower = frechet_bounds(a[0], b[0])[0]
    upper = frechet_bounds(a[1], b[1])[1]
    if failed:
        notes.append(f"{failed:g} failed requests counted outside both bounds")
    for bs, name in ((ttft, "TTFT"), (tok, slo.per_token.upper())):
        if not bs.on_edge:
            below = f"{bs.edge_below:g}" if bs.edge_below is not None else "0"
            notes.append(
                f"the {name} bound {bs.bound_s:g} s falls between bucket edges {below} and "
                f"{bs.edge_above:g} s: its share is a range"
            )
    label: HistogramLabel
    if math.isclose(lower, upper, rel_tol=0, abs_tol=1e-12):
        label = "exact"
    elif ttft.on_edge and tok.on_edge:
        label = "exact per bound, joint bounded"
    else:
        label = "bucket-bounded"
    return HistogramCompliance(
        slo=slo,
        ttft=ttft,
        per_token=tok,
        requests=requests,
        failed=failed,
        ttft_share=a,
        per_token_share=b,
        lower=lower,
        upper=upper,
        label=label,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------
# Error budget and burn rate
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """How much of the window's allowance of bad requests is spent, and how fast.

    `spent` is bad / allowed-bad among the requests seen so far (the verdict if the window
    closed now). `burn_rate` is the bad share over the allowance: 1.0 spends exactly the
    allowance by the window's end. `spent_of_window` and `time_left_s` project the pace
    over the whole window, assuming traffic stays as steady as it was.
    """

    share: float
    window_s: float
    elapsed_s: float
    total: float
    bad: float
    allowance: float
    bad_share: float
    spent: float
    remaining: float
    burn_rate: float
    spent_of_window: float
    time_left_s: float
    exhausted: bool
    notes: tuple[str, ...] = ()


def error_budget(slo: SLO, bad: float, total: float, elapsed_s: float | None = None) -> ErrorBudget:
    """Budget spent, burn rate and time left from the window's counts so far.

    `elapsed_s` is how much of the window the counts cover (None: all of it, a rolling
    window). With share 1 there is no allowance: any bad request exhausts it.
    """
    window = slo.window_s
    elapsed = window if elapsed_s is None else elapsed_s
    if math.isnan(elapsed) or not 0 <= elapsed <= window:
        raise InvalidInput(
            f"elapsed time must be from 0 to the window of {window:g} s, got {elapsed_s}"
        )
    if math.isnan(total) or math.isnan(bad) or total < 0 or bad < 0:
        raise InvalidInput(f"request counts must be >= 0, got bad={bad}, total={total}")
    if bad > total:
        raise InvalidInput(f"bad requests ({bad:g}) cannot outnumber all requests ({total:g})")
    allowance = slo.allowance
    notes: list[str] = []
    if total == 0:
        notes.append("no requests yet: nothing spent")
        bad_share = 0.0
    else:
        bad_share = bad / total
    if allowance <= 0:
        notes.append("share 1: no allowance, a single bad request exhausts the budget")
        burn = math.inf if bad > 0 else 0.0
    else:
        burn = bad_share / allowance
    spent = burn
    spent_of_window = burn * elapsed / window if burn != math.inf else math.inf
    if burn == 0:
        time_left = math.inf
    elif spent_of_window >= 1:
        time_left = 0.0
    else:
        # Spending at `burn`, the whole window's budget lasts window / burn seconds.
        time_left = window / burn - elapsed
    return ErrorBudget(
        share=slo.share,
        window_s=window,
        elapsed_s=elapsed,
        total=total,
        bad=bad,
        allowance=allowance,
        bad_share=bad_share,
        spent=spent,
        remaining=max(0.0, 1.0 - spent),
        burn_rate=burn,
        spent_of_window=spent_of_window,
        time_left_s=time_left,
        exhausted=spent >= 1.0,
        notes=tuple(notes),
    )
