"""Steps read back from token times: what each step carried and how long it took."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.simulate.engine import EngineConfig, StepCost
from planner.simulate.steps import (
    SLOPE_STEPS_MIN,
    ObservedStep,
    TokenTimes,
    context_slopes,
    observed_steps,
)

DECODE_S, MIXED_S = 0.003, 0.008


def lockstep(jitter_s: float = 0.0, seed: int = 0) -> list[TokenTimes]:
    """Four answers of 20 tokens decoding together from t=0 (3 ms a step), and a fifth
    whose prefill finishes in step 10 (8 ms), then decodes with them; each token reaches
    the client up to `jitter_s` late."""
    rng = np.random.default_rng(seed)
    lengths = [DECODE_S] * 30
    lengths[10] = MIXED_S
    ends = np.cumsum(lengths)  # step i ends at ends[i]

    def seen(steps: range) -> TokenTimes:
        at = ends[list(steps)] + rng.uniform(0, jitter_s, len(steps))
        return TokenTimes(prompt_tokens=256, first_s=float(at[0]), gaps_s=np.diff(at).tolist())

    return [seen(range(0, 20)) for _ in range(4)] + [seen(range(10, 25))]


def test_a_step_that_finishes_a_prefill_is_told_apart_and_timed() -> None:
    seen = observed_steps(lockstep(jitter_s=0.0005))
    assert seen.merged == 0
    assert len(seen.steps) == 25
    mixed = [s for s in seen.steps if s.prefills and s.decodes]
    assert len(mixed) == 1
    (step,) = mixed
    assert step.prefills == (256,) and step.decodes == 4
    assert step.seconds == pytest.approx(MIXED_S, abs=0.0006)
    plain = [s.seconds for s in seen.steps if not s.prefills and s.seconds is not None]
    assert float(np.median(plain)) == pytest.approx(DECODE_S, abs=0.0003)
    # The four answers' 11th tokens: context 256 + 10 each.
    assert step.decode_pairs == 4 * (256 + 10)


def test_the_first_step_decodes_nothing_and_has_no_length() -> None:
    first = observed_steps(lockstep()).steps[0]
    assert first.prefills == (256,) * 4 and first.decodes == 0 and first.seconds is None


def test_tokens_streamed_in_a_bunch_are_left_out_not_read_as_one_step() -> None:
    records = lockstep()
    # The fifth answer's tokens 3 and 4 reach the client together: one bunch, two tokens.
    late = list(records[4].gaps_s)
    late[2], late[3] = late[2] + late[3], 0.0
    records[4] = TokenTimes(256, records[4].first_s, late)
    seen = observed_steps(records)
    assert seen.merged == 1
    assert len(seen.steps) == 24


def test_a_step_is_modelled_with_its_prefill_chunk_within_the_budget() -> None:
    config = EngineConfig(num_blocks=1000, max_num_seqs=8, max_num_batched_tokens=512)
    cost = StepCost(0.001, 0.0, 0.0, 1e-5, additive=True, seq_s=1e-4, pair_s=1e-8)
    step = ObservedStep(at_s=0.0, seconds=0.008, decodes=7, decode_pairs=7 * 300, prefills=(600,))
    tokens, seqs, pairs, held = step.features(config)
    assert (tokens, seqs) == (7 + 505, 8)
    assert pairs == 7 * 300 + 505 * 95 + 505 * 506 // 2
    assert held == 7 * 300 + 600  # (the decodes' contexts and the whole prompt, once)
    # Two prefills finished in one step share what the decodes left of the budget.
    two = ObservedStep(at_s=0.0, seconds=0.01, decodes=7, decode_pairs=0, prefills=(300, 300))
    assert two.features(config)[:2] == (7 + 300 + 205, 9)
    assert step.modelled_s(cost, config) == pytest.approx(
        0.001 + tokens * 1e-5 + seqs * 1e-4 + pairs * 1e-8
    )
    read = replace(cost, kv_token_read_s=2e-8)
    assert step.modelled_s(read, config) == pytest.approx(
        step.modelled_s(cost, config) + held * 2e-8
    )


def test_no_tokens_no_steps() -> None:
    seen = observed_steps([])
    assert seen.steps == [] and seen.typical_s is None


def decode_steps(batch: int, per_token_s: float, n: int, seed: int = 0) -> list[ObservedStep]:
    """`n` decode-only steps of `batch` sequences over varied contexts, each 2 ms plus
    `per_token_s` a cached token, with host jitter and one stall in twenty."""
    rng = np.random.default_rng(seed)
    held = rng.integers(batch * 64, batch * 4096, n)
    seconds = 0.002 + held * per_token_s + rng.normal(0.0, 5e-5, n)
    seconds[rng.random(n) < 0.05] += 0.02
    pairs = zip(held, seconds, strict=True)
    return [ObservedStep(0.0, float(t), batch, int(h), ()) for h, t in pairs]


def test_context_slopes_read_a_cached_tokens_cost_for_each_batch_past_stalls() -> None:
    steps = [
        *decode_steps(1, 120e-9, 400),
        *decode_steps(4, 60e-9, 400, seed=1),
        *decode_steps(8, 40e-9, 400, seed=2),
    ]
    slopes = context_slopes(steps)
    assert set(slopes) == {1, 4, 8}
    for batch, per_token in ((1, 120e-9), (4, 60e-9), (8, 40e-9)):
        assert slopes[batch] == pytest.approx(per_token, rel=0.1)


def test_context_slopes_leave_out_steps_with_prefills_and_batches_seen_too_rarely() -> None:
    few = decode_steps(2, 60e-9, SLOPE_STEPS_MIN - 1)
    # A prefill's step is long whatever its context: counted, it would bend the line.
    mixed = [replace(s, seconds=0.02, prefills=(512,)) for s in decode_steps(1, 0.0, 400)]
    slopes = context_slopes([*decode_steps(1, 100e-9, 300), *few, *mixed])
    assert set(slopes) == {1}
    assert slopes[1] == pytest.approx(100e-9, rel=0.1)
    # One context only: no slope to read.
    same = [ObservedStep(0.0, 0.002, 3, 900, ()) for _ in range(SLOPE_STEPS_MIN)]
    assert context_slopes(same) == {}
