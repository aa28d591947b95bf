"""Contiguous reservation vs paged blocks: closed forms against brute force, and the claim."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.errors import InvalidInput
from planner.fragmentation import fragmentation, output_lengths


def brute(prompts: list[int], outputs: list[int], reserve: int, block: int) -> tuple[int, ...]:
    used = contiguous = paged = 0
    for p, o in zip(prompts, outputs, strict=True):
        for t in range(1, o + 1):
            used += p + t
            contiguous += reserve
            paged += math.ceil((p + t) / block) * block
    return used, contiguous, paged


@pytest.mark.parametrize("block", [1, 8, 16, 32])
def test_closed_form_equals_brute_force(block: int) -> None:
    rng = np.random.default_rng(7)
    prompts = rng.integers(0, 300, 40).tolist()
    outputs = rng.integers(1, 200, 40).tolist()
    result = fragmentation(prompts, outputs, 512, block)
    used, contiguous, paged = brute(prompts, outputs, 512, block)
    assert (result.used_token_steps, result.contiguous_token_steps, result.paged_token_steps) == (
        used,
        contiguous,
        paged,
    )


@pytest.mark.parametrize("kind", ["fixed", "uniform", "exponential", "lognormal"])
def test_the_60_to_80_versus_under_4_percent_result(kind: str) -> None:
    # 512-token prompts, outputs averaging 256 tokens, slots reserved for 2048 tokens.
    outputs = output_lengths(kind, 256, 1536)
    result = fragmentation(512, outputs, 2048, 16)
    assert 0.60 <= result.contiguous_waste <= 0.80
    assert result.paged_waste < 0.04
    assert result.capacity_gain > 2.5


def test_block_size_one_wastes_nothing() -> None:
    assert fragmentation([10, 20], [5, 7], 100, 1).paged_waste == 0


def test_output_lengths_are_deterministic_and_bounded() -> None:
    a = output_lengths("exponential", 300, 1000, n=500)
    assert (a == output_lengths("exponential", 300, 1000, n=500)).all()
    assert a.min() >= 1 and a.max() <= 1000
    assert abs(output_lengths("uniform", 300, 1000).mean() - 300) < 2
    assert (output_lengths("fixed", 64, 1000) == 64).all()


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: fragmentation([100], [50], 120, 16), "cannot hold the longest"),
        (lambda: fragmentation([100], [0], 1000, 16), "outputs >= 1"),
        (lambda: fragmentation([100], [5], 1000, 0), "at least 1"),
        (lambda: output_lengths("zipf", 10, 100), "valid choices: fixed, uniform"),
        (lambda: output_lengths("fixed", -1, 100), "positive mean"),
    ],
)
def test_bad_inputs(call: object, fragment: str) -> None:
    with pytest.raises(InvalidInput, match=fragment):
        call()  # type: ignore[operator]
