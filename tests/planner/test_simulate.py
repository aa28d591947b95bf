"""The simulated V1 scheduler: exact at low load, and the seeds' qualitative truths."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from planner.capacity import PlanRequest, plan_capacity
from planner.errors import InvalidInput
from planner.gpus import get_gpu
from planner.models import load_preset
from planner.simulate import EngineConfig, EngineStats, SimRequest, StepCost, simulate
from planner.simulate.engine import HostSpeed, RequestResult, pairs_of
from planner.simulate.roofline import roofline_cost
from tests.support.sim_reference import reference_simulate

COST = StepCost(overhead_s=0.002, weights_read_s=0.010, kv_token_read_s=2e-7, token_compute_s=2e-5)
CONFIG = EngineConfig(num_blocks=4096, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048)


def poisson(rate: float, n: int, prompt: int, output: int, seed: int = 0) -> list[SimRequest]:
    times = np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))
    return [SimRequest(float(t), prompt, output) for t in times]


def test_one_request_alone_is_its_prefill_then_its_decodes() -> None:
    (r,) = simulate([SimRequest(0.0, 1000, 5)], CONFIG, COST)
    prefill = COST.step_s(1000, 1000)
    decodes = sum(COST.step_s(1, 1000 + i) for i in range(1, 5))
    assert r.queue_s == 0 and r.ttft_s == pytest.approx(prefill)
    assert r.e2e_s == pytest.approx(prefill + decodes)
    assert r.tpot_s == pytest.approx(decodes / 4)
    # A prompt over the token budget takes several chunks before its first token.
    (long,) = simulate([SimRequest(0.0, 5000, 2)], CONFIG, COST)
    chunks = COST.step_s(2048, 2048) + COST.step_s(2048, 4096) + COST.step_s(904, 5000)
    assert long.ttft_s == pytest.approx(chunks)


def test_a_cost_given_in_whole_numbers_runs_as_its_floats_do() -> None:
    """A cost typed as `StepCost(0.001, 0, 0, ...)` (ints where nothing is read) once failed
    in the decode stretches' arithmetic."""
    as_ints = StepCost(0.001, 0, 0, 1e-5, additive=True, seq_s=1e-4)
    as_floats = StepCost(0.001, 0.0, 0.0, 1e-5, additive=True, seq_s=1e-4)
    traffic = poisson(20.0, 50, 300, 40)
    assert list(simulate(traffic, CONFIG, as_ints)) == list(simulate(traffic, CONFIG, as_floats))


def test_too_long_requests_are_refused_and_an_engine_that_cannot_start_is_an_error() -> None:
    stats = EngineStats()
    out = list(simulate([SimRequest(0.0, 8000, 500), SimRequest(0.1, 10, 10)], CONFIG, COST, stats))
    assert [r.refused for r in out] == [True, False] and stats.refused == 1
    with pytest.raises(InvalidInput, match="refuses to start"):
        EngineConfig(num_blocks=100, max_model_len=8192)
    with pytest.raises(InvalidInput, match="chunked prefill"):
        EngineConfig(num_blocks=4096, max_num_batched_tokens=2048, chunked_prefill=False)


def test_scarce_blocks_preempt_the_newest_and_every_request_still_finishes() -> None:
    traffic = [SimRequest(0.0, 500, 1500) for _ in range(16)]
    tight, ample = EngineStats(), EngineStats()
    small = replace(CONFIG, num_blocks=1024, max_model_len=2048)
    done = list(simulate(traffic, small, COST, tight))
    assert len(done) == 16 and tight.preemptions > 0
    assert max(r.preemptions for r in done) >= 1
    assert len(list(simulate(traffic, CONFIG, COST, ample))) == 16 and ample.preemptions == 0
    # The oldest request is never the one preempted.
    assert done[0].request is traffic[0] and done[0].preemptions == 0


def test_max_num_seqs_queues_the_rest() -> None:
    traffic = [SimRequest(0.0, 100, 50) for _ in range(8)]
    out = list(simulate(traffic, replace(CONFIG, max_num_seqs=4), COST))
    waited = sorted(r.queue_s or 0 for r in out)
    assert waited[:4] == [0, 0, 0, 0] and min(waited[4:]) > 0


def test_chunked_prefill_lowers_short_requests_ttft_p99_beside_long_prompts() -> None:
    config = replace(CONFIG, max_num_batched_tokens=16384, max_model_len=16384)
    short = poisson(4.0, 400, 128, 64, seed=1)
    long = poisson(0.2, 20, 12000, 16, seed=2)
    traffic = sorted(short + long, key=lambda r: r.arrival_s)

    def p99(budget: int, chunked: bool, threshold: int = 0) -> float:
        cfg = replace(
            config,
            max_num_batched_tokens=budget,
            chunked_prefill=chunked,
            long_prefill_token_threshold=threshold,
        )
        out = simulate(traffic, cfg, COST)
        ttft = [r.ttft_s for r in out if r.request.prompt_tokens == 128 and r.ttft_s is not None]
        return float(np.percentile(ttft, 99))

    whole = p99(16384, False)
    # Long prompts capped at 512 tokens a step leave the rest of the budget to short ones.
    assert p99(2048, True, threshold=512) < 0.5 * whole
    # Without the cap, V1 gives a running prefill the whole budget first: short requests
    # still wait for it (kvscope's A/B benchmark measured the same on the CPU engine).
    assert p99(512, True) > 0.5 * whole


def test_past_the_knee_p99_grows_far_faster_than_p50() -> None:
    def ttft(rate: float) -> tuple[float, float]:
        results = simulate(poisson(rate, 1500, 512, 128), CONFIG, COST)
        out = [r.ttft_s for r in results if r.ttft_s is not None]
        return float(np.percentile(out, 50)), float(np.percentile(out, 99))

    (p50_lo, p99_lo), (p50_hi, p99_hi) = ttft(10.0), ttft(25.0)  # the knee is near 22/s
    assert p99_hi - p99_lo > 3 * (p50_hi - p50_lo) > 0


def test_fp8_kv_about_doubles_the_context_where_a_batch_starts_preempting() -> None:
    base = PlanRequest(model=load_preset("llama-3.1-8b"), gpu=get_gpu("l4"), vllm_version="0.19")

    def onset(kv: str) -> int:
        plan = plan_capacity(replace(base, kv_dtype=kv, max_model_len=32768))
        config = EngineConfig(num_blocks=plan.usable_blocks, max_num_seqs=32, max_model_len=32768)
        for context in range(512, 32768, 256):
            stats = EngineStats()
            batch = [SimRequest(0.0, context // 2, context // 2) for _ in range(32)]
            for _ in simulate(batch, config, roofline_cost(plan), stats):
                pass
            if stats.preemptions:
                return context
        raise AssertionError("never preempted")

    assert 1.8 <= onset("fp8") / onset("auto") <= 2.2


def test_roofline_needs_a_catalog_gpu() -> None:
    plan = plan_capacity(
        PlanRequest(model=load_preset("llama-3.1-8b"), kv_cache_memory_bytes=1 << 30)
    )
    with pytest.raises(InvalidInput, match="roofline"):
        roofline_cost(plan)
    h100 = plan_capacity(PlanRequest(model=load_preset("llama-3.1-8b"), gpu=get_gpu("h100-sxm")))
    cost = roofline_cost(h100)
    # A decode step of one sequence is memory-bound: about the weights over the bandwidth.
    assert 0.005 < cost.step_s(1, 1000) < 0.01


CONFIGS = {
    "ample": CONFIG,
    "preempting": replace(CONFIG, num_blocks=700, max_model_len=2048),
    "few-seqs": replace(CONFIG, max_num_seqs=8),
    "long-prefill-cap": replace(CONFIG, long_prefill_token_threshold=256),
    "whole-prompts": replace(CONFIG, chunked_prefill=False, max_num_batched_tokens=8192),
    "starved": replace(CONFIG, num_blocks=300, max_model_len=2048, max_num_batched_tokens=512),
    # The CPU engine's block size: a block boundary every 32 tokens, not 16.
    "blocks-of-32": replace(CONFIG, num_blocks=350, block_size=32, max_model_len=2048),
}


# A calibrated step cost: additive, with per-sequence and per-attention-pair terms.
FITTED = StepCost(0.004, 0.0, 0.0, 3e-6, additive=True, seq_s=1.2e-4, pair_s=3e-8)
CASES = {name: (config, COST) for name, config in CONFIGS.items()}
CASES["fitted-cost"] = (CONFIG, FITTED)
CASES["fitted-cost-preempting"] = (CONFIGS["preempting"], FITTED)
CASES["first-chunk-admission"] = (replace(CONFIGS["preempting"], reserve_full_prompt=False), COST)


def test_a_prompt_waits_until_all_of_it_fits_as_vllm_0_32_admits() -> None:
    """Two 1,280-token requests fit in 95 blocks of 32 with room to grow; admitting a third
    on its first 512-token chunk (as before scheduler_reserve_full_isl) makes them preempt
    each other; admitting it only when its whole prompt fits does not."""
    config = EngineConfig(num_blocks=95, block_size=32, max_num_seqs=8,
                          max_num_batched_tokens=512, max_model_len=2048)  # fmt: skip
    traffic = [SimRequest(0.1 * i, 1024, 256) for i in range(6)]
    whole, first = EngineStats(), EngineStats()
    assert len(list(simulate(traffic, config, COST, whole))) == 6 and whole.preemptions == 0
    loose = replace(config, reserve_full_prompt=False)
    assert len(list(simulate(traffic, loose, COST, first))) == 6 and first.preemptions > 0


@pytest.mark.parametrize(("config", "cost"), CASES.values(), ids=CASES.keys())
def test_vectorised_engine_matches_the_plain_scheduler(
    config: EngineConfig, cost: StepCost
) -> None:
    """The engine (arrays, decode stretches in one go) against the scheduler as first written
    (one object per request, every step a walk): the same results to the bit, with and
    without the stretches."""
    rng = np.random.default_rng(3)
    times = np.cumsum(rng.exponential(1 / 12.0, 400))
    traffic = [
        SimRequest(float(t), int(rng.integers(1, 1200)), int(rng.integers(1, 700))) for t in times
    ]
    plain_stats, slow_stats, fast_stats = EngineStats(), EngineStats(), EngineStats()
    plain = list(reference_simulate(traffic, config, cost, plain_stats))
    slow = list(simulate(traffic, config, cost, slow_stats, fast_forward=False))
    fast = list(simulate(traffic, config, cost, fast_stats))
    key = lambda r: (r.request.arrival_s, r.request.prompt_tokens)  # noqa: E731
    assert sorted(plain, key=key) == sorted(slow, key=key) == sorted(fast, key=key)
    counts = [
        (s.steps, s.tokens, s.preemptions, s.refused) for s in (plain_stats, slow_stats, fast_stats)
    ]
    assert counts[0] == counts[1] == counts[2]
    assert fast_stats.busy_s == pytest.approx(plain_stats.busy_s, rel=1e-12)
    # The stretches ran (a run without any would pass the comparison without testing them).
    assert fast_stats.stretches > 0 and slow_stats.stretches == 0
    if fast_stats.preemptions:
        # Preempted requests found their own blocks again (prefix caching is on): without
        # the cache they recompute, and the run goes otherwise.
        off = list(simulate(traffic, replace(config, prefix_caching=False), cost))
        assert sorted(off, key=key) != sorted(fast, key=key)


def test_a_shared_prefix_is_computed_once_and_then_found_in_the_cache() -> None:
    """The second request under a key starts with the first's 1,024 system-prompt tokens
    computed (64 full blocks): its prefill is its 76 own tokens; with prefix caching off it
    computes all 1,100 again."""
    traffic = [SimRequest(t, 1100, 2, prefix="sys", prefix_tokens=1024, shares_tokens=1024)
               for t in (0.0, 10.0)]  # fmt: skip
    stats = EngineStats()
    first, second = simulate(traffic, CONFIG, COST, stats)
    assert first.ttft_s == pytest.approx(COST.step_s(1100, 1100, 1, pairs_of(1100, 0)))
    assert second.ttft_s == pytest.approx(COST.step_s(76, 1100, 1, pairs_of(76, 1024)))
    assert (stats.prefix_queries, stats.prefix_hits) == (2200, 1024)
    off = EngineStats()
    again = list(simulate(traffic, replace(CONFIG, prefix_caching=False), COST, off))
    assert again[1].ttft_s == pytest.approx(first.ttft_s) and off.prefix_queries == 0


def test_requests_under_one_prefix_hold_one_copy_of_its_blocks() -> None:
    """Eight requests running together on a 1,024-token prefix: the prefix's 64 blocks once
    (about 130 blocks in use), not eight times (about 600)."""
    traffic = [SimRequest(0.05 * i, 1056, 400, prefix="sys", prefix_tokens=1024,
                          shares_tokens=1024) for i in range(8)]  # fmt: skip
    peaks = []
    for caching in (True, False):
        stats = EngineStats()
        config = replace(CONFIG, prefix_caching=caching)
        assert len(list(simulate(traffic, config, COST, stats, sample_every_s=0.0))) == 8
        peaks.append(max(used for _, used, _ in stats.timeline))
    shared, alone = peaks
    assert shared <= 64 + 8 * 30 < 8 * 64 <= alone


def test_the_cache_counters_leave_out_readmissions_as_vllms_do() -> None:
    """vLLM counts a request's prefix-cache lookup at its first admission only (a request
    readmitted after a preemption goes to counters of its own): under preemption every
    request's prompt is counted once, and hits only of what the prefix gave it."""
    rng = np.random.default_rng(11)
    traffic = [SimRequest(0.02 * i, 1024 + int(rng.integers(1, 300)), int(rng.integers(200, 600)),
                          prefix="sys", prefix_tokens=1024, shares_tokens=1024)
               for i in range(60)]  # fmt: skip
    stats = EngineStats()
    done = list(simulate(traffic, CONFIGS["preempting"], COST, stats))
    assert len(done) == 60 and stats.preemptions > 10
    assert stats.prefix_queries == sum(r.prompt_tokens for r in traffic)
    assert stats.prefix_hits == 59 * 1024


@pytest.mark.parametrize(("keys", "hits"), [(["a", "b", "a"], 1536), (["a", "b", "c", "a"], 48)])
def test_idle_cached_blocks_are_evicted_oldest_first_before_anyone_is_preempted(
    keys: list[str], hits: int
) -> None:
    """200 blocks hold two idle 96-block prefixes: a third request takes the 93 blocks it
    lacks from the oldest's chain, its last blocks first (as vLLM frees a request's blocks
    tail first), so "a" comes back to a whole hit after one other key and to the 3 blocks
    left of its chain's start after two; nobody is preempted."""
    config = EngineConfig(num_blocks=200, block_size=16, max_num_batched_tokens=2048,
                          max_model_len=2048)  # fmt: skip
    traffic = [SimRequest(10.0 * i, 1600, 2, prefix=k, prefix_tokens=1536, shares_tokens=1536)
               for i, k in enumerate(keys)]  # fmt: skip
    stats = EngineStats()
    assert len(list(simulate(traffic, config, COST, stats))) == len(keys)
    assert stats.prefix_hits == hits and stats.preemptions == 0


def test_chat_turns_find_the_earlier_turns_in_the_cache_with_and_without_stretches() -> None:
    """Sessions publish their prompts and answers as they compute them; the next turn finds
    them. Decode stretches (which publish at their end) give the same results to the bit."""
    rng = np.random.default_rng(5)
    traffic, context = [], dict.fromkeys(range(6), 0)
    for i, t in enumerate(np.cumsum(rng.exponential(0.5, 120))):
        s = i % 6
        prompt, output = context[s] + int(rng.integers(20, 200)), int(rng.integers(5, 120))
        if prompt + output > 4000:
            prompt, context[s] = int(rng.integers(20, 200)), 0
        seen, shares = context[s], prompt + output
        traffic.append(SimRequest(float(t), prompt, output, "", f"s{s}", seen, shares))
        context[s] = prompt + output
    rates = []
    for blocks in (4096, 700):  # room for every session; too little (evictions)
        config = replace(CONFIG, num_blocks=blocks, max_model_len=4096)
        slow_stats, fast_stats = EngineStats(), EngineStats()
        slow = list(simulate(traffic, config, COST, slow_stats, fast_forward=False))
        fast = list(simulate(traffic, config, COST, fast_stats))
        assert slow == fast and fast_stats.stretches > 0
        assert slow_stats.prefix_hits == fast_stats.prefix_hits
        rates.append(fast_stats.prefix_hits / fast_stats.prefix_queries)
    assert rates[0] > 0.6 and rates[1] < rates[0] - 0.1


def test_a_turn_is_sent_once_its_sessions_previous_turn_has_ended() -> None:
    """A second turn due while the first is still decoding arrives when the first ends, so
    it does not queue and its TTFT is its own prefill; another session's turn due at the
    same time runs beside the first. A refused turn ends at once and lets the next go."""
    first, second, other = (
        SimRequest(0.0, 200, 50, session="a"),
        SimRequest(0.01, 300, 5, session="a"),
        SimRequest(0.01, 300, 5, session="b"),
    )
    results = {(r.request.session, r.request.prompt_tokens): r
               for r in simulate([first, second, other], CONFIG, COST)}  # fmt: skip
    a1, a2, b = results["a", 200], results["a", 300], results["b", 300]
    assert a1.e2e_s is not None and a2.ttft_s is not None and b.e2e_s is not None
    assert a2.request.arrival_s == pytest.approx(a1.e2e_s)
    assert a2.queue_s == 0.0
    assert a2.ttft_s == pytest.approx(COST.step_s(300, 300, 1, pairs_of(300, 0)))
    assert b.request.arrival_s == 0.01 and b.e2e_s + 0.01 < a1.e2e_s  # (ran alongside)
    long = replace(first, prompt_tokens=9000)  # over max_model_len: refused at once
    refused, after = simulate([long, second], CONFIG, COST)
    assert refused.refused and after.request.arrival_s == 0.01 and after.queue_s == 0.0


def _sessions(n: int, sessions: int, rate: float, seed: int) -> list[SimRequest]:
    """Chat turns of `sessions` interleaved sessions, each turn's prompt the last turn's
    prompt and answer plus a new message; every 40th turn too long for any engine here
    (refused), and a session that outgrows 1,800 tokens starts again."""
    rng = np.random.default_rng(seed)
    context = dict.fromkeys(range(sessions), 0)
    traffic = []
    for i, t in enumerate(np.cumsum(rng.exponential(1 / rate, n))):
        s = i % sessions
        prompt, output = context[s] + int(rng.integers(20, 400)), int(rng.integers(2, 200))
        if i % 40 == 39:
            prompt = 9000
        traffic.append(SimRequest(float(t), prompt, output, "", f"s{s}", context[s],
                                  prompt + output, session=f"s{s}"))  # fmt: skip
        context[s] = prompt + output if prompt + output <= 1800 else 0
    return traffic


@pytest.mark.parametrize("name", ["ample", "preempting", "few-seqs", "blocks-of-32"])
def test_held_turns_match_the_plain_scheduler(name: str) -> None:
    """Sessions whose turns wait for each other (ahead of the load, so many are held):
    the engine and the scheduler as first written give the same results to the bit, with
    and without the stretches (prefix caching off: the plain scheduler has none)."""
    config = replace(CONFIGS[name], prefix_caching=False)
    traffic = _sessions(300, 12, 30.0, seed=7)
    plain_stats, slow_stats, fast_stats = EngineStats(), EngineStats(), EngineStats()
    plain = list(reference_simulate(traffic, config, COST, plain_stats))
    slow = list(simulate(traffic, config, COST, slow_stats, fast_forward=False))
    fast = list(simulate(traffic, config, COST, fast_stats))
    assert sorted(plain, key=_by_turn) == sorted(slow, key=_by_turn) == sorted(fast, key=_by_turn)
    assert len(fast) == 300 and fast_stats.refused > 0 and fast_stats.stretches > 0
    counts = [
        (s.steps, s.tokens, s.preemptions, s.refused) for s in (plain_stats, slow_stats, fast_stats)
    ]
    assert counts[0] == counts[1] == counts[2]
    # Held: most turns arrived later than they were due (a held turn arrives when the one
    # before it ends, at no time any turn was due).
    due = {r.arrival_s for r in traffic}
    assert sum(r.request.arrival_s not in due for r in fast) > 150
    # No two turns of a session were ever in the engine at once.
    by_session: dict[str, list[tuple[float, float]]] = {}
    for r in fast:
        assert r.request.session is not None
        span = (r.request.arrival_s, r.request.arrival_s + (r.e2e_s or 0.0))
        by_session.setdefault(r.request.session, []).append(span)
    for spans in by_session.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-12 for a, b in itertools.pairwise(spans))


def _by_turn(r: RequestResult) -> tuple[str, float, int]:
    return r.request.session or "", r.request.arrival_s, r.request.prompt_tokens


@pytest.mark.parametrize("config", [CONFIG, CONFIGS["preempting"]], ids=["ample", "preempting"])
def test_a_host_speed_scales_each_window_and_stretches_stop_at_its_edges(
    config: EngineConfig,
) -> None:
    """Steps cost their window's factor; decode stretches end where a window does, so that
    they give what step-by-step runs give, to the bit. A constant factor of 2 is an engine
    twice as slow: every request's times doubled (at low load, where no queue forms)."""
    rng = np.random.default_rng(5)
    times = np.cumsum(rng.exponential(1 / 12.0, 300))
    traffic = [
        SimRequest(float(t), int(rng.integers(1, 1200)), int(rng.integers(1, 700))) for t in times
    ]
    speed = HostSpeed(0.7, (1.0, 1.6, 0.8, 1.25))
    slow_stats, fast_stats, plain_stats = EngineStats(), EngineStats(), EngineStats()
    slow = list(simulate(traffic, config, COST, slow_stats, fast_forward=False, speed=speed))
    fast = list(simulate(traffic, config, COST, fast_stats, speed=speed))
    list(simulate(traffic, config, COST, plain_stats))
    assert slow == fast and fast_stats.stretches > 0
    assert fast_stats.steps == slow_stats.steps
    assert fast_stats.busy_s == pytest.approx(slow_stats.busy_s, rel=1e-12)
    assert fast_stats.busy_s > plain_stats.busy_s  # (the factors average above 1)

    lone = [SimRequest(10.0 * i, 300, 40) for i in range(5)]
    once = list(simulate(lone, CONFIG, COST))
    twice = list(simulate(lone, CONFIG, COST, speed=HostSpeed(1.0, (2.0,))))
    for a, b in zip(once, twice, strict=True):
        assert a.ttft_s is not None and a.e2e_s is not None
        assert b.ttft_s == pytest.approx(2 * a.ttft_s) and b.e2e_s == pytest.approx(2 * a.e2e_s)
    with pytest.raises(InvalidInput, match="factors above 0"):
        HostSpeed(1.0, (1.0, 0.0))


@pytest.mark.parametrize("config", [CONFIG, CONFIGS["few-seqs"], CONFIGS["preempting"]],
                         ids=["ample", "few-seqs", "preempting"])  # fmt: skip
def test_each_arrival_takes_its_engine_time_from_the_steps_after_it(config: EngineConfig) -> None:
    """`StepCost.arrival_s` lengthens the steps after each request that arrived while a
    batch ran, each step at most doubled: an idle engine loses nothing; a lone request with
    arrivals behind it ends their costs later, five a step apart or five at once, an
    arrival's cost longer than a step spread over the steps; decode stretches end at each
    arrival, giving what step-by-step runs give, to the bit."""
    taxed = replace(COST, arrival_s=0.004)
    lone = [SimRequest(10.0 * i, 300, 40) for i in range(5)]
    assert list(simulate(lone, config, taxed)) == list(simulate(lone, config, COST))

    one_seq = replace(config, max_num_seqs=1)
    step = COST.step_s(1, 500)
    assert 0.004 < step < 0.03
    heavy = replace(taxed, arrival_s=0.03)  # (an arrival's cost longer than a step)
    for gap, cost, together in ((0.03, taxed, 1), (0.0, taxed, 5), (0.0, heavy, 5)):
        behind = [SimRequest(0.0, 100, 400)] + [SimRequest(0.01 + gap * i, 50, 5) for i in range(5)]
        first = {c: next(iter(simulate(behind, one_seq, c))) for c in (COST, cost)}
        assert first[COST].request is behind[0] and first[cost].request is behind[0]
        assert first[cost].e2e_s == pytest.approx((first[COST].e2e_s or 0.0) + 5 * cost.arrival_s)
        longest = step + min(together * cost.arrival_s, step)
        assert first[cost].itl_max_s == pytest.approx(longest, rel=0.01)

    # Near the knee: full batches, queues, arrivals inside stretches.
    burst = [SimRequest(0.0, 200, 100) for _ in range(8 * config.max_num_seqs)]
    end = max(r.e2e_s or 0.0 for r in simulate(burst, config, COST))
    rate = 0.9 * len(burst) / end
    rng = np.random.default_rng(7)
    times = np.cumsum(rng.exponential(1 / rate, 600))
    traffic = [
        SimRequest(float(t), int(rng.integers(100, 300)), int(rng.integers(50, 150))) for t in times
    ]
    plain_stats = EngineStats()
    list(simulate(traffic, config, COST, plain_stats))
    for cost in (taxed, replace(COST, arrival_s=0.03)):  # (the second outlasts a step)
        slow_stats, fast_stats = EngineStats(), EngineStats()
        slow = list(simulate(traffic, config, cost, slow_stats, fast_forward=False))
        fast = list(simulate(traffic, config, cost, fast_stats))
        assert slow == fast and fast_stats.stretches > 0
        assert fast_stats.steps == slow_stats.steps
        assert fast_stats.busy_s == pytest.approx(slow_stats.busy_s, rel=1e-12)
        assert fast_stats.busy_s > plain_stats.busy_s  # (arrivals found a batch running)


def test_a_step_with_a_token_count_not_run_lately_pays_for_its_plans() -> None:
    """`StepCost.shape_s`: a step whose token count the engine never ran pays it once;
    `replan_s`, one whose count it ran before but not among the last `shape_plans` counts
    (kept by use, not by age). Its count becomes the most recent; an engine that plans for
    free runs as before."""
    planning = replace(COST, shape_s=0.0025, shape_plans=3, replan_s=0.0004)
    lone = [SimRequest(1.0 * i, p, 1) for i, p in enumerate([300, 300, 301, 300, 302, 303, 300])]
    plain = [r.ttft_s for r in simulate(lone, CONFIG, COST)]
    planned = [r.ttft_s for r in simulate(lone, CONFIG, planning)]
    paid = [round((b or 0.0) - (a or 0.0), 6) for a, b in zip(plain, planned, strict=True)]
    # 300 new; again; 301 new; 300 kept; 302 new; 303 new (301 goes: 300 was used after it);
    # 300 still kept (three counts: 300, 302, 303).
    assert paid == [0.0025, 0.0, 0.0025, 0.0, 0.0025, 0.0025, 0.0]
    evicted = [SimRequest(1.0 * i, p, 1) for i, p in enumerate([300, 301, 302, 303, 300])]
    alone = {p: COST.step_s(p, p) for p in (300, 301, 302, 303)}
    over = [
        (r.ttft_s or 0.0) - alone[r.request.prompt_tokens]
        for r in simulate(evicted, CONFIG, planning)
    ]
    assert over == pytest.approx([0.0025] * 4 + [0.0004])  # (300 run before, evicted)
    # A lone request's decodes: its first decode step plans for one row, the rest do not.
    (r,) = simulate([SimRequest(0.0, 300, 6)], CONFIG, planning)
    (base,) = simulate([SimRequest(0.0, 300, 6)], CONFIG, COST)
    assert (r.e2e_s or 0.0) - (base.e2e_s or 0.0) == pytest.approx(2 * 0.0025)
    assert replace(COST, shape_s=0.0) == COST and COST.scaled(2.0).shape_plans == 32
    assert planning.scaled(2.0).shape_s == pytest.approx(0.005)
    assert planning.scaled(2.0).replan_s == pytest.approx(0.0008)


@pytest.mark.parametrize(
    "config", [CONFIGS["few-seqs"], CONFIGS["starved"]], ids=["few-seqs", "starved"]
)
def test_plans_paid_in_stretches_are_those_paid_step_by_step(config: EngineConfig) -> None:
    """A mix of prompt lengths under load: the stretches pay the plans their first step
    needs exactly as single steps do, and the planning shows in the busy time."""
    rng = np.random.default_rng(11)
    times = np.cumsum(rng.exponential(1 / 10.0, 500))
    traffic = [
        SimRequest(float(t), int(rng.integers(16, 1500)), int(rng.integers(2, 200))) for t in times
    ]
    planning = replace(COST, shape_s=0.0025, shape_plans=4, replan_s=0.0007)
    plain_stats, slow_stats, fast_stats = EngineStats(), EngineStats(), EngineStats()
    list(simulate(traffic, config, COST, plain_stats))
    slow = list(simulate(traffic, config, planning, slow_stats, fast_forward=False))
    fast = list(simulate(traffic, config, planning, fast_stats))
    assert slow == fast and fast_stats.stretches > 0
    assert fast_stats.steps == slow_stats.steps
    assert fast_stats.busy_s == pytest.approx(slow_stats.busy_s, rel=1e-12)
    assert fast_stats.busy_s > plain_stats.busy_s + 100 * 0.0025
