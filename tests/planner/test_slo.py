"""SLO promises: MLPerf presets, exact and bucket-bounded compliance, error budget."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from planner.errors import InvalidInput, UnknownChoice
from planner.slo import (
    SLO,
    bound_share,
    compliance_from_histograms,
    compliance_from_records,
    error_budget,
    frechet_bounds,
    get_preset,
    histogram_delta,
    parse_slo,
    slo_presets,
)

INF = math.inf
RULES = "https://github.com/mlcommons/inference_policies/blob/master/inference_rules.adoc"
CONF = "https://github.com/mlcommons/inference/blob/master/loadgen/mlperf.conf"
# vLLM's TTFT buckets (vllm/v1/metrics/loggers.py)
VLLM_TTFT_EDGES = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5]


def slo(**over: Any) -> SLO:
    fields: dict[str, Any] = {
        "name": "test",
        "ttft_s": 1.0,
        "tpot_s": 0.1,
        "share": 0.99,
        "window_s": 3600.0,
    }
    fields.update(over)
    return parse_slo(fields)


# ---------------------------------------------------------------------------------------
# The SLO model and its presets
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "ttft_s", "tpot_s"),
    [
        ("mlperf-server-llama-3.1-8b", 2.0, 0.100),
        ("mlperf-interactive-llama-3.1-8b", 0.5, 0.030),
        ("mlperf-server-llama-2-70b", 2.0, 0.200),
        ("mlperf-interactive-llama-2-70b", 0.45, 0.040),
        ("mlperf-server-llama-3.1-405b", 6.0, 0.175),
        ("mlperf-interactive-llama-3.1-405b", 4.5, 0.080),
        ("mlperf-server-deepseek-r1", 2.0, 0.080),
        ("mlperf-interactive-deepseek-r1", 1.5, 0.015),
        ("mlperf-server-mixtral-8x7b", 2.0, 0.200),
        ("mlperf-server-gpt-oss-120b", 3.0, 0.080),
    ],
)
def test_mlperf_presets(key: str, ttft_s: float, tpot_s: float) -> None:
    preset = slo_presets()[key]
    assert (preset.ttft_s, preset.tpot_s) == (ttft_s, tpot_s)
    assert preset.share == 0.99  # MLPerf's Server/Interactive tail percentile
    assert preset.per_token == "tpot"
    assert preset.request_class == "interactive"
    assert preset.window_s == 600  # MLPerf's minimum run duration
    assert RULES in preset.source and CONF in preset.source
    ms = f"{ttft_s * 1000:g} ms/{tpot_s * 1000:g} ms"
    assert ms in preset.source


def test_presets_cover_the_issue_and_nothing_unverified() -> None:
    keys = set(slo_presets())
    assert len(keys) == 10
    # The two sources disagree on GPT-OSS-120B Interactive's TPOT: not offered.
    assert "mlperf-interactive-gpt-oss-120b" not in keys


def test_presets_are_copies_and_frozen() -> None:
    presets = slo_presets()
    presets.clear()
    assert slo_presets()
    with pytest.raises(ValueError):
        get_preset("mlperf-server-llama-3.1-8b").share = 0.5  # type: ignore[misc]


def test_unknown_preset_lists_the_choices() -> None:
    with pytest.raises(UnknownChoice, match=r"mlperf-server-llama-3\.1-8b"):
        get_preset("mlperf-server-llama-4")


def test_describe() -> None:
    assert get_preset("mlperf-server-llama-3.1-8b").describe() == (
        "99% of interactive requests over 10 min: TTFT <= 2 s and TPOT <= 100 ms"
    )
    s = slo(per_token="itl", share=0.999, window_s=30 * 86400, request_class="batch")
    assert s.describe() == ("99.9% of batch requests over 30 d: TTFT <= 1 s and ITL <= 100 ms")


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"ttft_s": 0}, "ttft_s"),
        ({"ttft_s": -1.0}, "ttft_s"),
        ({"tpot_s": math.nan}, "tpot_s"),
        ({"share": 0}, "share"),
        ({"share": 99}, "share"),
        ({"window_s": 0}, "window_s"),
        ({"per_token": "e2e"}, "per_token"),
        ({"request_class": "offline"}, "request_class"),
        ({"name": "  "}, "name"),
        ({"target": "x"}, "target"),
    ],
)
def test_bad_slo_refused_with_the_field_named(over: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=f"SLO refused: .*{field}"):
        slo(**over)


def test_allowance_is_one_minus_share() -> None:
    assert slo(share=0.99).allowance == 0.01
    assert slo(share=1.0).allowance == 0.0


# ---------------------------------------------------------------------------------------
# Compliance from records
# ---------------------------------------------------------------------------------------


def test_compliance_from_records_by_hand() -> None:
    records = [
        (True, 0.5, 0.05),  # inside
        (True, 1.5, 0.05),  # TTFT out
        (True, 0.5, 0.2),  # TPOT out
        (False, None, None),  # failed: outside
        (True, 1.0, 0.1),  # on both bounds: inside
        (True, 0.3, None),  # one-token answer: inside
        (True, None, 0.05),  # no first token seen: outside
    ]
    ok = [r[0] for r in records]
    c = compliance_from_records([r[1] for r in records], [r[2] for r in records], ok, slo())
    assert (c.total, c.inside, c.outside, c.errors, c.bad) == (7, 3, 4, 1, 4)
    assert c.share == pytest.approx(3 / 7)
    assert c.ttft_share == pytest.approx(4 / 7)
    assert c.per_token_share == pytest.approx(5 / 7)
    assert c.meets is False


def test_errors_count_outside_even_with_good_latencies() -> None:
    c = compliance_from_records([0.1, 0.1], [0.01, 0.01], [True, False], slo(share=0.5))
    assert (c.inside, c.outside, c.errors) == (1, 1, 1)
    assert c.ttft_share == 0.5 and c.per_token_share == 0.5
    assert c.meets is True  # exactly the share: kept


def test_compliance_without_requests() -> None:
    c = compliance_from_records([], [], [], slo())
    assert c.total == 0 and math.isnan(c.share) and c.meets is None


def test_compliance_refuses_mismatched_or_bad_records() -> None:
    with pytest.raises(InvalidInput, match="one TTFT"):
        compliance_from_records([0.1], [0.1, 0.2], [True], slo())
    with pytest.raises(InvalidInput, match=r"ttfts\[1\]"):
        compliance_from_records([0.1, -0.2], [0.1, 0.1], [True, True], slo())
    with pytest.raises(InvalidInput, match=r"tpots\[0\]"):
        compliance_from_records([0.1], [math.nan], [True], slo())


# ---------------------------------------------------------------------------------------
# Compliance from histograms
# ---------------------------------------------------------------------------------------

BUCKETS = [(0.5, 50.0), (1.0, 80.0), (2.5, 95.0), (INF, 100.0)]


@pytest.mark.parametrize(
    ("bound", "lower", "upper", "below", "above", "on_edge"),
    [
        (1.0, 0.80, 0.80, 1.0, 1.0, True),  # on an edge: exact
        (0.1 * 10, 0.80, 0.80, 1.0, 1.0, True),  # float noise still on the edge
        (2.0, 0.80, 0.95, 1.0, 2.5, False),  # between edges
        (0.1, 0.0, 0.50, None, 0.5, False),  # below the first edge
        (5.0, 0.95, 1.00, 2.5, INF, False),  # above the last finite edge
    ],
)
def test_bound_share(
    bound: float, lower: float, upper: float, below: float | None, above: float, on_edge: bool
) -> None:
    b = bound_share(BUCKETS, bound)
    assert (b.lower, b.upper) == pytest.approx((lower, upper))
    assert (b.edge_below, b.edge_above, b.on_edge) == (below, above, on_edge)
    assert b.exact is (lower == upper)
    assert b.observations == 100


def test_bound_share_empty_gap_is_exact_off_edge() -> None:
    b = bound_share([(1.0, 5.0), (2.0, 5.0), (INF, 10.0)], 1.5)
    assert b.exact and not b.on_edge and b.lower == 0.5


def test_bound_share_refuses_bad_histograms() -> None:
    with pytest.raises(InvalidInput, match=r"\+Inf"):
        bound_share([(1.0, 3.0)], 0.5)
    with pytest.raises(InvalidInput, match="same bucket edge"):
        bound_share([(1.0, 3.0), (1.0, 3.0), (INF, 4.0)], 0.5)
    with pytest.raises(InvalidInput, match="positive"):
        bound_share(BUCKETS, 0.0)


def test_frechet() -> None:
    assert frechet_bounds(0.9, 0.8) == pytest.approx((0.7, 0.8))
    assert frechet_bounds(0.3, 0.4) == (0.0, 0.3)
    assert frechet_bounds(1.0, 0.75) == (0.75, 0.75)


def test_histogram_compliance_by_hand_on_edges() -> None:
    s = slo(ttft_s=1.0, tpot_s=0.1, share=0.7)
    ttft = [(0.5, 50.0), (1.0, 90.0), (INF, 100.0)]  # 90% inside
    tpot = [(0.05, 60.0), (0.1, 80.0), (INF, 100.0)]  # 80% inside
    h = compliance_from_histograms(ttft, tpot, s)
    assert h.ttft_share == (0.9, 0.9) and h.per_token_share == (0.8, 0.8)
    assert (h.lower, h.upper) == pytest.approx((0.7, 0.8))
    assert h.label == "exact per bound, joint bounded" and h.exact_per_bound
    assert h.meets is True  # even the lower bound reaches 0.7


def test_histogram_compliance_collapses_when_one_bound_holds_for_all() -> None:
    s = slo(ttft_s=1.0, tpot_s=0.1, share=0.8)
    h = compliance_from_histograms([(1.0, 50.0), (INF, 50.0)], [(0.1, 40.0), (INF, 50.0)], s)
    assert (h.lower, h.upper) == pytest.approx((0.8, 0.8))
    assert h.label == "exact" and h.meets is True


def test_histogram_compliance_between_edges_and_failures() -> None:
    s = slo(ttft_s=2.0, tpot_s=0.1, share=0.99)
    ttft = [(1.0, 80.0), (2.5, 95.0), (INF, 100.0)]
    tpot = [(0.1, 90.0), (INF, 90.0)]  # 10 one-token answers have no TPOT
    h = compliance_from_histograms(ttft, tpot, s, failed=5)
    assert h.requests == 105
    assert h.ttft_share == pytest.approx((80 / 105, 95 / 105))
    assert h.per_token_share == pytest.approx((100 / 105, 100 / 105))
    assert h.lower == pytest.approx(80 / 105 + 100 / 105 - 1)
    assert h.upper == pytest.approx(95 / 105)
    assert h.label == "bucket-bounded" and not h.exact_per_bound
    assert h.meets is False
    assert any("between bucket edges 1 and 2.5" in n for n in h.notes)
    assert any("5 failed" in n for n in h.notes)


def test_histogram_compliance_undecided_and_empty() -> None:
    s = slo(ttft_s=2.0, tpot_s=0.1, share=0.9)
    h = compliance_from_histograms([(1.0, 80.0), (2.5, 100.0), (INF, 100.0)], [(INF, 0.0)], s)
    assert (h.lower, h.upper) == (0.8, 1.0) and h.meets is None
    empty = compliance_from_histograms([(INF, 0.0)], [(INF, 0.0)], s)
    assert math.isnan(empty.lower) and empty.meets is None


def test_itl_histograms_are_flagged_rough() -> None:
    s = slo(per_token="itl")
    h = compliance_from_histograms([(1.0, 10.0), (INF, 10.0)], [(0.1, 900.0), (INF, 1000.0)], s)
    assert h.per_token_share == pytest.approx((0.9, 0.9))
    assert any("token gaps" in n for n in h.notes)


def _histogram(values: list[float], edges: list[float]) -> list[tuple[float, float]]:
    return [(e, float(sum(v <= e for v in values))) for e in [*edges, INF]]


@pytest.mark.parametrize("seed", range(200))
def test_true_share_always_lies_inside_the_bounds(seed: int) -> None:
    rng = random.Random(seed)
    edges = sorted(rng.sample(VLLM_TTFT_EDGES, rng.randint(1, len(VLLM_TTFT_EDGES))))
    tok_edges = sorted({round(rng.uniform(0.005, 0.3), 3) for _ in range(rng.randint(1, 8))})
    n = rng.randint(1, 300)
    ttfts = [rng.lognormvariate(math.log(0.3), 1.0) for _ in range(n)]
    # A few one-token answers (no TPOT); TPOT correlated with TTFT some of the time.
    tpots: list[float | None] = [
        None if rng.random() < 0.1 else (0.2 * t if rng.random() < 0.5 else rng.uniform(0, 0.3))
        for t in ttfts
    ]
    failed = rng.randint(0, 5)
    # Half the time put each bound on an edge.
    ttft_bound = rng.choice(edges) if rng.random() < 0.5 else rng.uniform(0.001, 3.0)
    tok_bound = rng.choice(tok_edges) if rng.random() < 0.5 else rng.uniform(0.001, 0.4)
    s = slo(ttft_s=ttft_bound, tpot_s=tok_bound)
    h = compliance_from_histograms(
        _histogram(ttfts, edges),
        _histogram([p for p in tpots if p is not None], tok_edges),
        s,
        failed=failed,
    )
    exact = compliance_from_records(
        [*ttfts, *[None] * failed], [*tpots, *[None] * failed], [True] * n + [False] * failed, s
    )
    eps = 1e-12
    assert h.ttft_share[0] - eps <= exact.ttft_share <= h.ttft_share[1] + eps
    assert h.per_token_share[0] - eps <= exact.per_token_share <= h.per_token_share[1] + eps
    assert h.lower - eps <= exact.share <= h.upper + eps
    if h.ttft.on_edge:
        assert h.ttft_share[0] == pytest.approx(exact.ttft_share)
    if h.per_token.on_edge:
        assert h.per_token_share[0] == pytest.approx(exact.per_token_share)


def test_histogram_delta_and_counter_reset() -> None:
    earlier = [(1.0, 10.0), (INF, 12.0)]
    later = [(INF, 20.0), (1.0, 15.0)]
    assert histogram_delta(later, earlier) == [(1.0, 5.0), (INF, 8.0)]
    restarted = [(1.0, 2.0), (INF, 3.0)]
    assert histogram_delta(restarted, earlier) == [(1.0, 2.0), (INF, 3.0)]
    with pytest.raises(InvalidInput, match="different bucket edges"):
        histogram_delta([(2.0, 1.0), (INF, 1.0)], earlier)


# ---------------------------------------------------------------------------------------
# Error budget and burn rate
# ---------------------------------------------------------------------------------------

HOUR = 3600.0


def test_budget_half_spent_in_a_rolling_window() -> None:
    b = error_budget(slo(share=0.99, window_s=HOUR), bad=5, total=1000)
    assert b.bad_share == 0.005 and b.allowance == 0.01
    assert b.burn_rate == pytest.approx(0.5) and b.spent == pytest.approx(0.5)
    assert b.remaining == pytest.approx(0.5) and not b.exhausted
    # At half the sustainable pace the window's budget lasts two windows: one more left.
    assert b.time_left_s == pytest.approx(HOUR)


def test_budget_burning_twice_too_fast_halfway() -> None:
    b = error_budget(slo(share=0.99, window_s=HOUR), bad=20, total=1000, elapsed_s=HOUR / 2)
    assert b.burn_rate == pytest.approx(2.0)
    assert b.spent == pytest.approx(2.0) and b.exhausted and b.remaining == 0
    assert b.spent_of_window == pytest.approx(1.0)
    assert b.time_left_s == 0


def test_budget_at_exactly_the_sustainable_pace() -> None:
    b = error_budget(slo(share=0.99, window_s=HOUR), bad=10, total=1000, elapsed_s=HOUR / 4)
    assert b.burn_rate == 1.0 and b.spent == 1.0 and b.exhausted
    assert b.spent_of_window == pytest.approx(0.25)
    assert b.time_left_s == pytest.approx(0.75 * HOUR)  # lasts exactly to the window's end


def test_budget_without_requests() -> None:
    b = error_budget(slo(), bad=0, total=0, elapsed_s=0)
    assert (b.burn_rate, b.spent, b.exhausted, b.time_left_s) == (0.0, 0.0, False, INF)
    assert any("no requests" in n for n in b.notes)


def test_share_one_has_no_allowance() -> None:
    s = slo(share=1.0)
    clean = error_budget(s, bad=0, total=500)
    assert not clean.exhausted and clean.burn_rate == 0 and clean.time_left_s == INF
    one_bad = error_budget(s, bad=1, total=500)
    assert one_bad.exhausted and one_bad.burn_rate == INF and one_bad.time_left_s == 0
    assert any("no allowance" in n for n in one_bad.notes)


@pytest.mark.parametrize(
    ("bad", "total", "elapsed", "match"),
    [
        (5, 3, None, "outnumber"),
        (-1, 3, None, ">= 0"),
        (1, 3, 2 * HOUR, "elapsed"),
        (1, 3, -1.0, "elapsed"),
    ],
)
def test_budget_refuses_bad_counts(
    bad: float, total: float, elapsed: float | None, match: str
) -> None:
    with pytest.raises(InvalidInput, match=match):
        error_budget(slo(window_s=HOUR), bad=bad, total=total, elapsed_s=elapsed)
