"""What-if runs: traffic from the shared profiles, figures in fixed memory, the SLO search."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from planner.errors import InvalidInput
from planner.gpus import get_gpu
from planner.models import load_preset
from planner.simulate import EngineConfig, StepCost, whatif
from planner.simulate.setup import parse_settings, scenario
from planner.simulate.whatif import (
    Scenario,
    Sketch,
    SloBounds,
    capacity_rps,
    highest,
    max_rate,
    meets,
    predict,
    sweep,
    traffic,
)
from planner.stats import percentile
from planner.workload import Arrival, FixedProfile, get_profile

COST = StepCost(overhead_s=0.002, weights_read_s=0.010, kv_token_read_s=2e-7, token_compute_s=2e-5)
CONFIG = EngineConfig(num_blocks=4096, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048)
FIXED = FixedProfile(prompt_tokens=1000, output_tokens=5)


def test_the_sketch_reads_quantiles_within_half_a_percent_in_fixed_memory() -> None:
    values = np.random.default_rng(0).lognormal(-3, 1.2, 100_000)
    sketch = Sketch()
    size = sketch.counts.nbytes
    for v in values:
        sketch.add(float(v))
    for q in (0.5, 0.95, 0.99):
        assert sketch.quantile(q) == pytest.approx(float(np.quantile(values, q)), rel=0.006)
    figures = sketch.figures()
    assert figures.max == pytest.approx(values.max()) and sketch.counts.nbytes == size
    assert figures.mean == pytest.approx(values.mean())
    assert Sketch().quantile(0.5) is None


def test_a_small_runs_quantiles_read_as_the_probes_read_theirs() -> None:
    """A latency probe's p99 interpolates between order statistics; a p99 of 98 requests
    is then near the second slowest, not the slowest (0.56 s here, not 0.76), and the
    simulator's must read the same way to be compared with it."""
    rng = np.random.default_rng(2)
    for n in (1, 2, 5, 98, 283):
        values = rng.lognormal(-3, 1.2, n)
        sketch = Sketch()
        sketch.add_many(values)
        for q in (0.0, 0.5, 0.95, 0.99, 1.0):
            expected = percentile(list(values), q)
            assert sketch.quantile(q) == pytest.approx(expected, rel=0.006)
    tail = np.array([0.02] * 96 + [0.557, 0.758])
    sketch = Sketch()
    sketch.add_many(tail)
    assert sketch.quantile(0.99) == pytest.approx(0.563, rel=0.006)


def test_weighted_arrays_count_as_their_values_repeated() -> None:
    """The engine's gaps arrive as small arrays, each gap seen by several requests."""
    rng = np.random.default_rng(1)
    chunks = [rng.lognormal(-4, 0.5, int(rng.integers(1, 40))) for _ in range(500)]
    weights = [float(rng.integers(1, 9)) for _ in chunks]
    batched, one_by_one = Sketch(), Sketch()
    for values, w in zip(chunks, weights, strict=True):
        batched.add_many(values, w)
        for v in values:
            for _ in range(int(w)):
                one_by_one.add(float(v))
    batched.add_many(np.array([]), 5.0)  # nothing to count
    a, b = batched.figures(), one_by_one.figures()
    assert (a.p50, a.p95, a.p99, a.max) == (b.p50, b.p95, b.p99, b.max)
    assert a.mean == pytest.approx(b.mean, rel=1e-12)
    assert np.array_equal(batched.counts, one_by_one.counts)
    assert batched.n == sum(len(v) * w for v, w in zip(chunks, weights, strict=True))


def test_traffic_comes_from_the_probes_profiles_with_their_classes() -> None:
    profile = get_profile("code-review")
    first = list(traffic(profile, Arrival(rate=5.0), 2000, seed=1))
    assert first == list(traffic(profile, Arrival(rate=5.0), 2000, seed=1))
    assert len(first) == 2000 and first[0].arrival_s == 0.0
    assert all(np.diff([r.arrival_s for r in first]) >= 0)
    classes = {r.cls for r in first}
    assert classes == {"short", "long"}
    long_share = sum(r.cls == "long" for r in first) / len(first)
    assert 0.07 < long_share < 0.13
    # Lengths are the profile's draws (what the probes send for the same seed's shapes).
    assert min(r.prompt_tokens for r in first if r.cls == "long") >= 4000
    # The simulator streams the probes' schedule: the same times, never held whole.
    for arrival in (Arrival(rate=3.0), Arrival(kind="gamma", rate=2.0, cv=3.0)):
        streamed = list(itertools.islice(arrival.iter_offsets(5, chunk=777), 5000))
        assert streamed == arrival.offsets(5000, 5)
    with pytest.raises(InvalidInput, match="ramp"):
        next(Arrival(kind="ramp", rate=1.0, end_rate=2.0, ramp_s=10.0).iter_offsets())
    # Bursty arrivals: gaps with a coefficient of variation near the one asked for.
    bursty = list(traffic(profile, Arrival(kind="gamma", rate=5.0, cv=3.0), 20_000))
    gaps = np.diff([r.arrival_s for r in bursty])
    assert 2.5 < gaps.std() / gaps.mean() < 3.5


def test_a_quiet_engine_predicts_the_prefill_and_the_decodes() -> None:
    what = Scenario(CONFIG, COST, FIXED, requests=50, arrival="constant")
    p = predict(what, rate=0.2)  # one request every 5 s, each done in well under a second
    assert p.ttft_s.p50 == pytest.approx(COST.step_s(1000, 1000), rel=0.01)
    assert p.queue_s.max == 0 and p.preemptions == 0 and p.refused == 0
    assert p.tpot_s.p50 == pytest.approx(COST.step_s(1, 1002), rel=0.01)
    assert p.utilisation < 0.1 and not p.extrapolation
    assert p.slo_share is None and p.by_class == []


def test_past_the_capacity_the_prediction_is_flagged_and_the_slo_missed() -> None:
    slo = SloBounds(ttft_s=0.2, tpot_s=0.05)
    what = Scenario(CONFIG, COST, FixedProfile(prompt_tokens=512, output_tokens=128), 600, slo=slo)
    capacity = capacity_rps(what)
    low, high = predict(what, capacity * 0.3), predict(what, capacity * 1.2)
    assert low.utilisation == pytest.approx(0.3) and not low.extrapolation
    assert "utilisation" in high.extrapolation[0]
    assert meets(low, slo) and not meets(high, slo)
    assert high.ttft_s.p99 is not None and low.ttft_s.p99 is not None
    assert high.ttft_s.p99 > 5 * low.ttft_s.p99
    assert low.goodput_rps == pytest.approx(low.requests / low.duration_s)


def test_the_highest_rate_meeting_the_slo_agrees_with_a_grid() -> None:
    slo = SloBounds(ttft_s=0.15, tpot_s=0.05, share=0.95)
    profile = FixedProfile(prompt_tokens=512, output_tokens=64)
    what = Scenario(CONFIG, COST, profile, 1000, slo=slo)
    best = max_rate(what)
    capacity = capacity_rps(what)
    assert best is not None and meets(predict(what, best, capacity=capacity), slo)
    # The first failing rate of a 2 % grid: the search lands below it, within the few per
    # cent by which a finite run's met/missed boundary is ragged near the capacity.
    grid = capacity * 0.5 * 1.02 ** np.arange(60)
    first_miss = next(r for r in grid if not meets(predict(what, float(r), 0, capacity), slo))
    assert first_miss / 1.1 <= best <= first_miss * 1.02
    # The prediction it stopped on is that rate's, as predicted alone (the same seed).
    found = highest(what)
    assert found is not None and found[0] == best
    assert found[1] == predict(what, best, 0, capacity)
    strict = replace(what, slo=SloBounds(ttft_s=0.001, tpot_s=0.05))
    assert max_rate(strict) is None and highest(strict) is None
    with pytest.raises(InvalidInput, match="SLO"):
        max_rate(replace(what, slo=None))


def test_a_short_run_holds_past_the_capacity_and_the_highest_rate_finds_where() -> None:
    """400 requests at 120 % of the burst capacity still meet the SLO (the queue has no
    time to grow): the highest rate is searched past 110 % of it, up to where it breaks."""
    slo = SloBounds(ttft_s=0.15, tpot_s=0.05, share=0.95)
    what = Scenario(CONFIG, COST, FixedProfile(prompt_tokens=512, output_tokens=64), 400, slo=slo)
    capacity = capacity_rps(what)
    assert meets(predict(what, capacity * 1.2, 0, capacity), slo)
    found = highest(what)
    assert found is not None and found[0] > capacity * 1.2 and meets(found[1], slo)
    assert not meets(predict(what, found[0] * 1.05, 0, capacity), slo)


def test_seconds_of_arrivals_make_a_run_as_long_as_a_probes_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`duration_s` instead of a count: rate x duration requests, as a latency probe's
    window; a 20 s window starting empty holds a rate that 2000 requests queue at."""
    slo = SloBounds(ttft_s=0.15, tpot_s=0.05, share=0.95)
    long = Scenario(CONFIG, COST, FixedProfile(prompt_tokens=512, output_tokens=64), 2000, slo=slo)
    short = replace(long, duration_s=20.0)
    assert short.count(10.0) == 200 and long.count(10.0) == 2000
    assert predict(short, 10.0).requests == 200
    found_short, found_long = highest(short), highest(long)
    assert found_short is not None and found_long is not None
    assert found_short[0] > found_long[0] * 1.05
    with pytest.raises(InvalidInput, match="at most 1,000,000"):
        short.count(60_000.0)
    # An SLO met at any rate: the top is raised only while a run stays within that count
    # (made small here, to simulate few requests).
    monkeypatch.setattr(whatif, "MAX_REQUESTS", 4000)
    anything = SloBounds(ttft_s=1e9, tpot_s=1e9, share=0.5)
    top = highest(replace(short, slo=anything))
    assert top is not None and meets(top[1], anything)
    assert top[0] * 20 <= 4000 < top[0] * 2 * 20
    with pytest.raises(InvalidInput, match="duration_s must be above 0"):
        replace(long, duration_s=0.0)
    assert parse_settings(["duration_s=30"]).duration_s == 30.0
    with pytest.raises(InvalidInput, match="num_requests or duration_s"):
        parse_settings(["duration_s=30", "num_requests=100"])


def test_seeds_give_an_interval_on_p99_and_rates_a_curve() -> None:
    what = Scenario(CONFIG, COST, get_profile("chat"), 300)
    one, two = sweep(what, [2.0, 20.0], seeds=9)
    assert one.ttft_p99 is not None and one.ttft_p99.seeds == 9
    assert one.ttft_p99.low <= one.ttft_p99.high
    assert one.prediction.rate == 2.0 and two.prediction.rate == 20.0
    assert sweep(what, [2.0], seeds=8)[0].ttft_p99 is None


@pytest.mark.parametrize("seeds", [9, 10, 19, 30])
def test_the_interval_holds_another_seeds_p99_four_times_in_five(seeds: int) -> None:
    # Skewed values, as p99s are; the interval claims nothing about their shape.
    rng = np.random.default_rng(seeds)
    trials = 4000
    held = 0
    for _ in range(trials):
        xs = rng.lognormal(0.0, 0.6, seeds + 1)
        got = whatif._interval(list(xs[:-1]))
        assert got is not None
        held += got.low <= xs[-1] <= got.high
    j = max(1, (seeds + 1) // 10)
    expected = (seeds + 1 - 2 * j) / (seeds + 1)  # 0.80, 0.82, 0.80, 0.81
    # Four standard deviations of a binomial share over 4,000 trials: about +-2.6 %.
    assert abs(held / trials - expected) < 4 * (expected * (1 - expected) / trials) ** 0.5
    assert held / trials >= 0.78


def test_a_runs_drift_is_drawn_from_the_calibrations_fit_error_and_host_speed() -> None:
    fitted = Scenario(CONFIG, COST, FIXED, 100, residuals=(-0.06, 0.12))
    draws = np.array([whatif.drift(fitted, seed) for seed in range(4000)])
    # One run in ten at least the 10th percentile's error below, one in ten the 90th's above.
    assert np.mean(draws <= 0.94) == pytest.approx(0.10, abs=0.015)
    assert np.mean(draws >= 1.12) == pytest.approx(0.10, abs=0.015)
    assert np.median(draws) == pytest.approx(1.0, abs=0.005)
    assert draws.min() >= 1 - 1.25 * 0.06 and draws.max() <= 1 + 1.25 * 0.12
    # A whole run at one of the host's windows: each about as often as the others.
    windows = replace(fitted, residuals=None, speed=(0.9, 1.0, 1.1))
    counts = Counter(whatif.drift(windows, seed) for seed in range(3000))
    assert set(counts) == {0.9, 1.0, 1.1} and min(counts.values()) > 900
    both = np.array([whatif.drift(replace(fitted, speed=(0.9, 1.1)), s) for s in range(4000)])
    assert np.std(both) > np.std(draws)
    assert whatif.drift(replace(fitted, residuals=None), 3) == 1.0
    assert whatif.drift(replace(fitted, residuals=(0.0, 0.0)), 3) == 1.0


@pytest.mark.parametrize("n", [3, 5, 12])
def test_from_a_few_later_runs_the_drift_is_drawn_from_what_they_predict_of_the_next(
    n: int,
) -> None:
    """Checks of later runs say how far the host moves, where the calibration's own fit
    error does not: from MIN_CHECKS on, the next run's drift falls between the draws' 10th
    and 90th percentiles four times in five, however few the checks (wider with fewer)."""
    fitted = Scenario(CONFIG, COST, FIXED, 100, residuals=(-0.02, 0.02))
    rng = np.random.default_rng(n)
    trials, held, widths = 300, 0, []
    for _ in range(trials):
        drifts = rng.lognormal(0.1, 0.12, n + 1)
        checked = replace(fitted, drifts=tuple(drifts[:-1]))
        draws = [whatif.drift(checked, seed) for seed in range(200)]
        low, high = np.quantile(draws, [0.1, 0.9])
        held += low <= drifts[-1] <= high
        widths.append(high / low)
    assert held / trials == pytest.approx(0.8, abs=0.07)
    # The fit error alone (x0.98 to x1.02 here) would have held it far less often.
    assert np.median(widths) > 1.3


def test_before_enough_checks_the_drift_is_the_fit_errors() -> None:
    fitted = Scenario(CONFIG, COST, FIXED, 100, residuals=(-0.06, 0.12))
    two = replace(fitted, drifts=(1.3, 1.4))
    assert [whatif.drift(two, s) for s in range(50)] == [whatif.drift(fitted, s) for s in range(50)]
    three = replace(fitted, drifts=(1.3, 1.4, 1.35))
    assert np.median([whatif.drift(three, s) for s in range(500)]) == pytest.approx(1.35, rel=0.02)


def test_past_the_knee_the_fit_error_widens_the_interval_through_the_queue() -> None:
    """The fit error moves every step, so past the knee, where the queue grows by what the
    engine falls behind, a 10 % error moves the p99 by far more than 10 %: the interval
    draws it through the simulation, not on the p99."""
    what = Scenario(CONFIG, COST, FixedProfile(prompt_tokens=256, output_tokens=64), 400)
    rate = 1.25 * capacity_rps(what)
    bare = sweep(what, [rate], seeds=19)[0]
    fitted = sweep(replace(what, residuals=(-0.1, 0.1)), [rate], seeds=19)[0]
    assert bare.ttft_p99 is not None and fitted.ttft_p99 is not None
    assert fitted.prediction == bare.prediction  # (the point prediction is the fit's)
    spread = fitted.ttft_p99.high / fitted.ttft_p99.low
    assert spread > 1.5 * (bare.ttft_p99.high / bare.ttft_p99.low) * (1.1 / 0.9)
    point = bare.prediction.ttft_s.p99
    assert point is not None and fitted.ttft_p99.low < point < fitted.ttft_p99.high


def test_each_interval_seed_draws_the_calibrations_pools_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's noise, speed windows and queued spread are one tuning run's sample, and a
    p99 is its few worst requests: each seed of an interval draws its pools again, so that
    a pool's tail counts for what one run showed, not for the host's."""
    stalls = tuple((0.3, 0.3) if i % 50 == 0 else (0.001, 0.001) for i in range(200))
    fitted = Scenario(
        CONFIG, COST, FIXED, 100, residuals=(-0.05, 0.05), noise=stalls,
        queued_tpot=(0.8, 1.0, 1.3), speed=(0.9, 1.0, 1.1, 1.2),
    )  # fmt: skip
    drawn = [whatif.redrawn(fitted, seed) for seed in range(400)]
    counts = np.array([sum(n == (0.3, 0.3) for n in d.noise) for d in drawn])
    assert all(len(d.noise) == 200 and set(d.noise) <= set(stalls) for d in drawn)
    assert counts.mean() == pytest.approx(4, abs=0.3) and counts.min() <= 1 and counts.max() >= 8
    assert all(len(d.speed) == 4 and set(d.speed) <= set(fitted.speed) for d in drawn)
    assert len({d.speed for d in drawn}) > 20 and len({d.queued_tpot for d in drawn}) > 5
    assert len({d.cost for d in drawn}) == 400  # (each with its own drift)
    roofline = Scenario(CONFIG, COST, FIXED, 100)
    assert whatif.redrawn(roofline, 3) is roofline
    # A heavy-tailed pool: the seeds' p99s spread wider with the pools drawn again.
    tail = np.random.default_rng(0).lognormal(-4, 1.5, 200)
    heavy = Scenario(
        CONFIG, COST, FixedProfile(prompt_tokens=256, output_tokens=8), 250,
        noise=tuple((float(x), float(x)) for x in tail),
    )  # fmt: skip
    again = sweep(heavy, [2.0], seeds=39)[0].ttft_p99
    monkeypatch.setattr(whatif, "_resample", lambda pool, rng: tuple(pool))
    kept = sweep(heavy, [2.0], seeds=39)[0].ttft_p99
    assert again is not None and kept is not None
    assert again.high / again.low > 1.1 * (kept.high / kept.low)


def test_from_enough_checks_each_seed_draws_one_runs_host_noise() -> None:
    """A tuning run in a quiet spell has no stalls, and drawing its pool again adds none:
    from MIN_CHECKS later runs on, each seed first takes one run's pool, the tuning run's or
    a check's, so that the interval reaches the stalls later runs met (and before, not)."""
    quiet = tuple((0.001, 0.001) for _ in range(200))
    stalls = tuple((0.3, 0.3) if i % 25 == 0 else (0.001, 0.001) for i in range(100))
    fitted = Scenario(
        CONFIG, COST, FixedProfile(prompt_tokens=256, output_tokens=8), 300,
        residuals=(-0.02, 0.02), noise=quiet, noise_pools=(stalls, stalls),
    )  # fmt: skip
    two = replace(fitted, drifts=(1.0, 1.01))
    assert all(set(whatif.redrawn(two, s).noise) == {(0.001, 0.001)} for s in range(100))
    three = replace(fitted, drifts=(1.0, 1.01, 0.99))
    drawn = [whatif.redrawn(three, s).noise for s in range(300)]
    stalled = np.mean([(0.3, 0.3) in d for d in drawn])
    assert stalled == pytest.approx(2 / 3, abs=0.08)  # (two pools of three have stalls)
    assert all(len(d) in (100, 200) for d in drawn)
    # The point prediction keeps the tuning run's noise; the interval reaches the stalls.
    rate = 0.4 * capacity_rps(fitted)
    without, with_pools = (
        sweep(s, [rate], seeds=19)[0] for s in (replace(three, noise_pools=()), three)
    )
    assert without.prediction == with_pools.prediction
    assert without.ttft_p99 is not None and with_pools.ttft_p99 is not None
    assert without.ttft_p99.high < 0.1 < 0.25 < with_pools.ttft_p99.high


def test_settings_take_the_engine_specs_and_the_probes_names() -> None:
    s = parse_settings(["kv_cache_dtype=fp8", "max-num-seqs=32", "enable_chunked_prefill=false"])
    assert (s.kv_cache_dtype, s.max_num_seqs, s.enable_chunked_prefill) == ("fp8", 32, False)
    with pytest.raises(InvalidInput, match="unknown setting 'batch'"):
        parse_settings(["batch=3"])
    with pytest.raises(InvalidInput, match="key=value"):
        parse_settings(["max_num_seqs"])
    with pytest.raises(InvalidInput, match="max_num_seqs"):
        parse_settings(["max_num_seqs=0"])
    model, gpu = load_preset("llama-3.1-8b"), get_gpu("l4")
    base = parse_settings(["max_model_len=8192", "max_num_seqs=32"])
    what, plan = scenario(model, gpu, base, "chat")
    assert what.config.num_blocks == plan.usable_blocks and what.config.max_num_seqs == 32
    fp8, _ = scenario(model, gpu, base.model_copy(update={"kv_cache_dtype": "fp8"}), "chat")
    assert fp8.config.num_blocks >= 1.9 * what.config.num_blocks
    whole, _ = scenario(model, gpu, base.model_copy(update={"enable_chunked_prefill": False}))
    assert not whole.config.chunked_prefill and whole.config.max_num_batched_tokens >= 8192
    with pytest.raises(InvalidInput, match="not both"):
        scenario(model, gpu, base.model_copy(update={"prompt_tokens": 100}), "chat")
    with pytest.raises(InvalidInput, match="no KV cache"):
        scenario(load_preset("qwen2.5-72b"), gpu, base)


def test_fp8_kv_preempts_less_under_the_same_long_context_load() -> None:
    model, gpu = load_preset("llama-3.1-8b"), get_gpu("l4")
    base = parse_settings(
        ["max_model_len=16384", "max_num_seqs=64", "prompt_tokens=6000", "output_tokens=400"]
    )
    base = base.model_copy(update={"num_requests": 150})
    runs = {}
    for kv in ("auto", "fp8"):
        what, _ = scenario(model, gpu, base.model_copy(update={"kv_cache_dtype": kv}))
        runs[kv] = predict(what, rate=1.0)
    assert runs["auto"].preemptions > 0
    assert runs["fp8"].preemptions < runs["auto"].preemptions / 2


@pytest.mark.parametrize("name", ["shared-prefix", "multi-turn"])
def test_profiles_that_share_text_are_served_from_the_prefix_cache(name: str) -> None:
    """A shared system prompt and chat sessions' earlier turns hit the prefix cache: most
    prompt tokens found there and TTFT lower than with caching off at the same rate (the
    median less so: a short prefill costs the weights' read either way)."""
    on = Scenario(CONFIG, COST, get_profile(name), 400)
    off = replace(on, config=replace(CONFIG, prefix_caching=False))
    hit, miss = predict(on, rate=2.0), predict(off, rate=2.0)
    assert hit.prefix_hit_rate is not None and hit.prefix_hit_rate > 0.5
    assert miss.prefix_hit_rate is None
    assert hit.ttft_s.p50 is not None and miss.ttft_s.p50 is not None
    assert hit.ttft_s.p99 is not None and miss.ttft_s.p99 is not None
    assert hit.ttft_s.p50 < 0.9 * miss.ttft_s.p50 and hit.ttft_s.p99 < 0.7 * miss.ttft_s.p99


def test_chat_sessions_send_each_turn_after_the_last_answer() -> None:
    """As the probes send them, a session's turn waits for its previous answer: far past the
    engine's capacity the turns of the sessions under way cannot pile up, only new sessions
    do (they start on schedule), so the queue's tail is a small part of the same turns'
    sent on schedule, and the run lasts longer than its schedule."""
    what = Scenario(CONFIG, COST, get_profile("multi-turn"), 400)
    rate = 10 * capacity_rps(what)
    turns = list(traffic(what.profile, what.arrivals(rate), what.requests))
    paced = predict(what, rate, requests=turns)
    rushed = predict(what, rate, requests=[replace(r, session=None) for r in turns])
    assert paced.requests == rushed.requests == 400
    assert paced.queue_s.p99 is not None and rushed.queue_s.p99 is not None
    assert paced.queue_s.p99 < rushed.queue_s.p99 / 5
    assert paced.duration_s > rushed.duration_s > turns[-1].arrival_s
