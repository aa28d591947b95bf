"""The reserve-vs-violation frame, the shares it weighs, and the degradation ladder."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest

from planner.capacity import PlanRequest, plan_capacity
from planner.cost import (
    CostInputs,
    Degradation,
    ShareTable,
    cost_frame,
    cost_of_reserve,
    cost_of_violation,
    deferred_queue,
    fewer_chunks,
    ladder,
    no_reasoning,
    share_outside_from_measurements,
    share_outside_from_queueing,
    share_table,
    shorter_answers,
    smaller_model,
)
from planner.errors import InvalidInput
from planner.gpus import get_gpu
from planner.models import load_preset
from planner.queueing import erlang_c

INPUTS = CostInputs(
    price_per_gpu_hour=2.0,
    gpus_per_replica=2,
    hours=10.0,
    requests_per_hour=100.0,
    cost_per_violation=1.0,
)


def test_cost_formulas() -> None:
    assert cost_of_reserve(2.5, 8, 720) == 14_400
    assert cost_of_violation(0.01, 1_000_000, 0.05) == pytest.approx(500)


def test_minimum_on_a_hand_made_table() -> None:
    # 1,000 requests; reserve costs 0, 40, 80, 120; violations 100, 20, 5, 0
    table = share_table({0: 0.1, 1: 0.02, 2: 0.005, 3: 0.0}, source="measured")
    frame = cost_frame(INPUTS, table)
    assert [r.total for r in frame.rows] == pytest.approx([100, 60, 85, 120])
    assert [r.reserve_gpus for r in frame.rows] == [0, 2, 4, 6]
    assert [r.violations for r in frame.rows] == pytest.approx([100, 20, 5, 0])
    assert frame.best.reserve == 1 and frame.best.is_minimum
    assert [r.is_minimum for r in frame.rows] == [False, True, False, False]


def test_a_tie_goes_to_the_smaller_reserve() -> None:
    # reserve 1 costs 40 in GPUs and saves exactly 40 in violations
    frame = cost_frame(INPUTS, share_table({0: 0.05, 1: 0.01}, source="model"))
    assert frame.rows[0].total == frame.rows[1].total == pytest.approx(50)
    assert frame.best.reserve == 0


def test_source_label_passes_through_untouched() -> None:
    label = "measured: latency probes #12, #13 (2026-11-29)"
    frame = cost_frame(INPUTS, share_table(lambda r: 0.1 / (r + 1), source=label))
    assert frame.source == label
    assert [r.reserve for r in frame.rows] == [0, 1, 2, 3, 4]
    modelled = share_outside_from_queueing(10, 3, 4, 0.5)
    assert cost_frame(INPUTS, modelled).source == "model: queueing"
    assert cost_frame(INPUTS, modelled).notes == modelled.notes


@pytest.mark.parametrize(
    ("reserves", "shares", "source", "match"),
    [
        ((0, 1), (0.1,), "m", "one share"),
        ((0, 1), (0.1, 1.5), "m", "from 0 to 1"),
        ((-1, 0), (0.1, 0.1), "m", "0 or more"),
        ((0, 1), (0.1, 0.1), " ", "where the shares come from"),
    ],
)
def test_share_table_refusals(
    reserves: tuple[int, ...], shares: tuple[float, ...], source: str, match: str
) -> None:
    with pytest.raises(InvalidInput, match=match):
        ShareTable(reserves, shares, source)


@pytest.mark.parametrize(
    "over",
    [
        {"price_per_gpu_hour": -1.0},
        {"gpus_per_replica": 0},
        {"hours": 0.0},
        {"requests_per_hour": math.nan},
        {"cost_per_violation": math.inf},
    ],
)
def test_cost_inputs_refusals(over: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        replace(INPUTS, **over)


# ---------------------------------------------------------------------------------------
# Shares from the queueing model and from measurements
# ---------------------------------------------------------------------------------------


def test_queueing_share_falls_with_reserve() -> None:
    table = share_outside_from_queueing(10.0, 3.0, 4, 0.5, ca=1.5, cs=1.2)
    assert table.source == "model: queueing"
    assert all(a > b for a, b in itertools.pairwise(table.shares))


def test_queueing_share_is_the_mm1_tail_for_one_poisson_replica() -> None:
    lam, mu, t = 0.8, 1.0, 2.0
    table = share_outside_from_queueing(lam, mu, 1, t, reserves=(0, 1))
    assert table.at(0) == pytest.approx(0.8 * math.exp(-(mu - lam) * t))
    # two replicas behind one queue: M/M/2
    c_wait = erlang_c(2, lam / mu)
    assert table.at(1) == pytest.approx(c_wait * math.exp(-(2 * mu - lam) * t))


def test_overloaded_levels_count_everything_outside() -> None:
    table = share_outside_from_queueing(10.0, 3.0, 2, 0.5, reserves=(0, 1, 2))
    assert table.shares[:2] == (1.0, 1.0)  # 10 req/s on 6 and 9 req/s of replicas
    assert table.shares[2] < 1
    assert any("reserve 0, 1" in n and "without bound" in n for n in table.notes)


def test_a_random_split_is_worse_than_one_pooled_queue() -> None:
    pooled = share_outside_from_queueing(10.0, 3.0, 4, 0.5, slots_per_replica=4)
    split = share_outside_from_queueing(10.0, 3.0, 4, 0.5, slots_per_replica=4, pooled=False)
    assert all(p < s for p, s in zip(pooled.shares, split.shares, strict=True))


def test_measured_points_interpolated_at_each_reserve_load() -> None:
    points = [(3.0, 0.2), (1.0, 0.0), (2.0, 0.01)]
    table = share_outside_from_measurements(points, arrival_rate=10.0, base_replicas=4)
    # loads 2.5, 2.0, 1.667, 1.429, 1.25 per replica
    expected = [0.105, 0.01, 0.01 * (2 / 3), 0.01 * (3 / 7), 0.0025]
    assert list(table.shares) == pytest.approx(expected)
    assert table.source == "measured" and table.notes == ()


def test_measurements_outside_their_range_are_held_and_noted() -> None:
    table = share_outside_from_measurements(
        [(2.0, 0.01), (3.0, 0.2)], 12.0, 2, reserves=(0, 4), source="measured: sweep 7"
    )
    assert table.shares == (0.2, 0.01)  # loads 6 and 2
    assert table.source == "measured: sweep 7"
    assert any("above the highest" in n for n in table.notes)
    only_below = share_outside_from_measurements([(2.0, 0.05)], 1.0, 1, reserves=(0,))
    assert only_below.shares == (0.05,) and "below the lowest" in only_below.notes[0]


def test_measurements_refusals() -> None:
    with pytest.raises(InvalidInput, match="at least one"):
        share_outside_from_measurements([], 1.0, 1)
    with pytest.raises(InvalidInput, match="same rate"):
        share_outside_from_measurements([(1.0, 0.1), (1.0, 0.2)], 1.0, 1)
    with pytest.raises(InvalidInput, match="from 0 to 1"):
        share_outside_from_measurements([(1.0, 2.0)], 1.0, 1)
    with pytest.raises(InvalidInput, match="base replicas"):
        share_outside_from_measurements([(1.0, 0.1)], 1.0, 0)


# ---------------------------------------------------------------------------------------
# The degradation ladder
# ---------------------------------------------------------------------------------------


def base_request() -> PlanRequest:
    return PlanRequest(model=load_preset("llama-3.1-70b"), gpu=get_gpu("h100-sxm"), num_gpus=4)


def concurrency(req: PlanRequest, context: int) -> float:
    plan = plan_capacity(replace(req, context=context))
    return min(plan.max_concurrency, plan.max_num_seqs) * plan.replicas


def test_each_step_frees_capacity_in_the_right_direction() -> None:
    steps = ladder(
        base_request(),
        [
            shorter_answers(0.5),
            no_reasoning(200),
            fewer_chunks(4, 256),
            smaller_model(load_preset("llama-3.1-8b"), tp=1),
            deferred_queue(0.2),
        ],
        prompt_tokens=3000,
        output_tokens=1000,
    )
    assert [s.name for s in steps] == [
        "shorter answers",
        "no reasoning",
        "4 fewer retrieved chunks",
        "smaller model: llama-3.1-8b",
        "deferred queue",
    ]
    for s in steps:
        assert s.concurrency_after >= s.concurrency_before
        assert 0 < s.freed_share < 1
    # Steps chain: each starts where the one before ended.
    for a, b in itertools.pairwise(steps):
        assert b.concurrency_before == a.concurrency_after
    assert [(s.prompt_tokens, s.output_tokens) for s in steps] == [
        (3000, 500),
        (3000, 300),
        (1976, 300),
        (1976, 300),
        (1976, 300),
    ]
    # Deferring moves traffic, not KV: concurrency unchanged, exactly its share freed.
    assert steps[-1].concurrency_after == steps[-1].concurrency_before
    assert steps[-1].freed_share == pytest.approx(0.2)
    assert steps[-1].traffic_share == pytest.approx(0.8)
    # Freed shares compound: what is left is the product of what each step left.
    left = math.prod(1 - s.freed_share for s in steps)
    assert steps[-1].freed_total == pytest.approx(1 - left)
    assert "llama-3.1-70b -> llama-3.1-8b (tp 1, 4 replicas)" in steps[3].how


def test_ladder_concurrency_is_the_kv_planners() -> None:
    req = base_request()
    (step,) = ladder(req, [shorter_answers(0.25)], prompt_tokens=2000, output_tokens=2000)
    assert step.concurrency_before == pytest.approx(concurrency(req, 4000))
    assert step.concurrency_after == pytest.approx(concurrency(req, 2500))
    assert step.freed_share == pytest.approx(1 - step.concurrency_before / step.concurrency_after)


def test_smaller_model_on_the_same_gpus_gets_more_replicas() -> None:
    req = replace(base_request(), max_num_seqs=256)
    (step,) = ladder(
        req,
        [smaller_model(load_preset("llama-3.1-8b"), tp=1)],
        prompt_tokens=900,
        output_tokens=100,
    )
    small = plan_capacity(replace(req, model=load_preset("llama-3.1-8b"), tp=1, context=1000))
    assert small.replicas == 4
    # Short requests: the 8B replicas hold more than max_num_seqs, so the cap binds.
    assert step.concurrency_after == pytest.approx(4 * small.max_num_seqs)
    assert "max_num_seqs" in step.how


def test_ladder_refusals() -> None:
    req = base_request()
    with pytest.raises(InvalidInput, match="prompt tokens"):
        ladder(req, [fewer_chunks(10, 100)], prompt_tokens=1000, output_tokens=10)
    with pytest.raises(InvalidInput, match="no output tokens"):
        ladder(req, [no_reasoning(500)], prompt_tokens=1000, output_tokens=500)
    with pytest.raises(InvalidInput, match="leaves no KV cache"):
        ladder(
            replace(req, gpu=get_gpu("l4"), num_gpus=1, tp=None),
            [],
            prompt_tokens=100,
            output_tokens=100,
        )
    with pytest.raises(InvalidInput, match="output factor"):
        shorter_answers(1.5)
    with pytest.raises(InvalidInput, match="deferred share"):
        deferred_queue(1.0)
    with pytest.raises(InvalidInput, match="name"):
        Degradation(" ")


def test_a_cold_start_costs_the_requests_a_late_replica_misses() -> None:
    from planner.cost import cold_start_cost

    inputs = CostInputs(
        price_per_gpu_hour=2.0, gpus_per_replica=2, hours=100, requests_per_hour=36_000,
        cost_per_violation=0.05,
    )  # fmt: skip
    got = cold_start_cost(inputs, base_replicas=2, cold_start_s=30, surges_per_hour=2)
    # One replica's share is 5 req/s; 30 s cold: 150 requests a surge, 200 surges.
    assert got.violations_per_surge == pytest.approx(150)
    assert got.violations == pytest.approx(30_000)
    assert got.cost_on_demand == pytest.approx(1_500)
    assert got.cost_one_reserve == pytest.approx(400)  # 2 GPUs x $2 x 100 h
    with pytest.raises(InvalidInput, match="at least one replica"):
        cold_start_cost(inputs, base_replicas=0, cold_start_s=30, surges_per_hour=2)


def test_retries_multiply_the_load_and_a_budget_bounds_it() -> None:
    from planner.cost import retry_amplification

    assert retry_amplification(0.0, 3).attempts == 1.0
    # 1 + 0.2 + 0.04 + 0.008 attempts per request.
    assert retry_amplification(0.2, 3).attempts == pytest.approx(1.248)
    assert retry_amplification(1.0, 3).attempts == 4.0  # everything fails: every retry taken
    capped = retry_amplification(0.5, 5, budget=0.1)
    assert capped.attempts_unbounded == pytest.approx(1.96875) and capped.attempts == 1.1
    assert capped.budget_binds and not retry_amplification(0.01, 5, budget=0.1).budget_binds
    with pytest.raises(InvalidInput, match="failure share is from 0 to 1"):
        retry_amplification(1.5, 3)
