"""Calibration: the fit recovers a known step cost, says how well it fits, and a calibrated
scenario keeps what the measurements fixed."""

from __future__ import annotations

import functools
import re
from dataclasses import replace

import numpy as np
import pytest

from planner.errors import InvalidInput
from planner.simulate import EngineConfig, EngineStats, SimRequest, StepCost, simulate
from planner.simulate.calibrate import (
    CHECK_NOISE_SAMPLES,
    SHAPE_LENGTHS,
    SHAPE_PARAMS,
    SWEEP_CONTEXT,
    Calibration,
    Check,
    DecodeSample,
    LoadRun,
    PrefillSample,
    Sweep,
    arrival_cost,
    bursts,
    decode_samples,
    drift_of,
    fit,
    full_batch,
    host_drift,
    host_speed,
    load_rate,
    lone_decodes,
    moved_since,
    noise_of,
    on_steps,
    prefill_samples,
    queued_spread,
    quiet_fit,
    retune_hint,
    shape_cost,
    sweep_prefills,
    tune,
    tuning_refused,
)
from planner.simulate.engine import SPEED_WINDOW_S, HostSpeed, pairs_of
from planner.simulate.setup import calibrated_scenario, parse_settings
from planner.simulate.steps import ObservedStep
from planner.simulate.whatif import Scenario, capacity_rps, predict, traffic
from planner.workload import Arrival, FixedProfile

TRUE = StepCost(overhead_s=0.004, weights_read_s=0.0, kv_token_read_s=0.0, token_compute_s=3e-6,
                additive=True, seq_s=1.2e-4, pair_s=3e-8)  # fmt: skip
API_S = 0.012
CONFIG = EngineConfig(num_blocks=511, block_size=32, max_num_seqs=8, max_num_batched_tokens=512)


def samples(noise: float = 0.0, seed: int = 0) -> tuple[list[DecodeSample], list[PrefillSample]]:
    rng = np.random.default_rng(seed)

    def jitter(x: float) -> float:
        return x * (1 + noise * rng.standard_normal())

    context = SWEEP_CONTEXT[0] + SWEEP_CONTEXT[1] / 2
    decodes = [DecodeSample(c, context, jitter(closed_loop_tpot(c))) for c in (1, 2, 4, 8)]
    # A lone request's TTFT, as the engine simulates it (its prompt in budget-sized chunks).
    prefills = [
        PrefillSample(n, jitter(API_S + lone_ttft(n))) for n in (64, 1024, 4096) for _ in "ab"
    ]
    return decodes, prefills


@functools.cache
def closed_loop_tpot(concurrency: int) -> float:
    """The median TPOT of a closed loop at `concurrency`, as the engine simulates it: a
    backlog admitted `concurrency` at a time, each finish letting the next in."""
    prompt, output = SWEEP_CONTEXT
    backlog = [SimRequest(0.0, prompt, output) for _ in range(16 * concurrency)]
    config = replace(CONFIG, max_num_seqs=concurrency)
    tpots = [r.tpot_s for r in simulate(backlog, config, TRUE) if r.tpot_s is not None]
    return float(np.median(tpots[2 * concurrency :]))  # past the first, synchronised wave


def lone_ttft(prompt: int) -> float:
    (r,) = simulate([SimRequest(0.0, prompt, 2)], CONFIG, TRUE)
    assert r.ttft_s is not None
    return r.ttft_s


def test_the_fit_recovers_the_step_cost_and_the_api_time() -> None:
    cal = fit(*samples(), CONFIG)
    # A closed loop's prompts mix into its decode steps only on average in the fit's model:
    # the coefficients come back within a few per cent, the fit within one.
    assert cal.overhead_s == pytest.approx(TRUE.overhead_s, rel=0.05)
    assert cal.token_s == pytest.approx(TRUE.token_compute_s, rel=0.1)
    assert cal.seq_s == pytest.approx(TRUE.seq_s, rel=0.1)
    assert cal.pair_s == pytest.approx(TRUE.pair_s, rel=0.1)
    assert cal.api_s == pytest.approx(API_S, rel=0.05)
    assert -0.01 < cal.residual_low <= cal.residual_high < 0.01
    assert (cal.max_prompt, cal.max_batch, cal.samples) == (4096, 8, 10)
    assert cal.config() == CONFIG and cal.cost().additive


def test_lone_decodes_say_what_a_cached_token_costs_and_not_how_fast_an_idle_engine_is() -> None:
    """A decode step that reads each cached token (a CPU's attention over a long context):
    the sweep decodes at one context only, lone answers at 64 to 4,096 tokens tell the
    slope, even when an engine woken from idle runs their few steps slower; a calibration
    stored before the term was fitted costs nothing for it."""
    truth = replace(TRUE, kv_token_read_s=2e-7)
    prompt, output = SWEEP_CONTEXT
    decodes = []
    for c in (1, 2, 4, 8):
        backlog = [SimRequest(0.0, prompt, output) for _ in range(16 * c)]
        done = simulate(backlog, replace(CONFIG, max_num_seqs=c), truth)
        tpots = [r.tpot_s for r in done if r.tpot_s is not None][2 * c :]
        decodes.append(DecodeSample(c, prompt + output / 2, float(np.median(tpots))))
    prefills, lone = [], []
    for n in (64, 1024, 4096):
        (r,) = simulate([SimRequest(0.0, n, 16)], CONFIG, truth)
        assert r.ttft_s is not None and r.e2e_s is not None
        prefills.append(PrefillSample(n, API_S + r.ttft_s))
        lone.append((n, 16, API_S + r.ttft_s, API_S + r.e2e_s + 15 * 0.0005))  # (idle: slower)
    cal = fit([*decodes, *lone_decodes(lone)], prefills, CONFIG)
    assert cal.kv_s == pytest.approx(2e-7, rel=0.15)
    assert cal.cost().kv_token_read_s == cal.kv_s
    assert f"+ {cal.kv_s * 1e9:.1f} ns a cached token;" in cal.quiet_step()
    assert cal.overhead_s == pytest.approx(TRUE.overhead_s, rel=0.05)
    long = SimRequest(0.0, 3000, 64)
    (want,) = simulate([long], CONFIG, truth)
    (got,) = simulate([long], CONFIG, cal.cost())
    assert got.tpot_s == pytest.approx(want.tpot_s, rel=0.03)
    # Without the lone decodes the sweep cannot tell it: a long context's steps come short.
    (blind,) = simulate([long], CONFIG, fit(decodes, prefills, CONFIG).cost())
    assert blind.tpot_s is not None and want.tpot_s is not None
    assert blind.tpot_s < 0.95 * want.tpot_s
    older = cal.model_dump(exclude={"kv_s"})
    older["quiet_rows"] = [[*r[:4], r[5]] for r in cal.quiet_rows]  # (five columns then)
    stored = Calibration.model_validate(older)
    assert stored.kv_s == 0.0 and stored.cost().kv_token_read_s == 0.0
    steps = [
        ObservedStep(0.0, 0.002 + 0.0002 * k, k, k * 300, ()) for k in (1, 2, 4) for _ in range(20)
    ]
    steps += [ObservedStep(0.0, 0.004, 1, 300, (256,)) for _ in range(20)]
    assert on_steps(stored, steps).step_kinds == 4  # (its rows fit again beside new ones)


def test_noisy_measurements_widen_the_residuals_and_keep_coefficients_non_negative() -> None:
    cal = fit(*samples(noise=0.1, seed=3), CONFIG)
    assert cal.residual_low < -0.01 and cal.residual_high > 0.01
    assert min(cal.overhead_s, cal.token_s, cal.seq_s, cal.pair_s, cal.api_s) >= 0
    assert cal.overhead_s == pytest.approx(TRUE.overhead_s, rel=0.3)
    # A measurement that no positive coefficient explains (prefill cheaper than a decode):
    # the negative term is dropped, not kept.
    decodes, prefills = samples()
    cheap = [PrefillSample(p.prompt_tokens, 0.001) for p in prefills]
    assert min(fit(decodes, cheap, CONFIG).model_dump(include={"api_s", "token_s"}).values()) >= 0


def test_too_few_kinds_of_measurement_are_refused() -> None:
    decodes, prefills = samples()
    with pytest.raises(InvalidInput, match="two batch sizes"):
        fit(decodes[:1], prefills, CONFIG)
    with pytest.raises(InvalidInput, match="two prompt lengths"):
        fit(decodes, prefills[:2], CONFIG)


def test_samples_come_from_a_batch_sweep_and_lone_requests() -> None:
    sweep = Sweep.model_validate(
        {"steps": [{"concurrency": 1, "itl_s": {"p50": 0.02}, "ttft_s": {"p50": 0.03}},
                   {"concurrency": 2, "itl_s": {"p50": None}}]}
    )  # fmt: skip
    (one,) = decode_samples(sweep)
    assert (one.batch, one.itl_s) == (1, 0.02) and one.context == 288
    assert sweep_prefills(sweep) == [PrefillSample(SWEEP_CONTEXT[0], 0.03)]
    pairs = [(64, 0.05), (None, 0.1), (1024, None), (1024, float("nan")), (4096, 0.4)]
    assert [p.prompt_tokens for p in prefill_samples(pairs)] == [64, 4096]
    # A lone answer's TPOT: one sequence decoding over its prompt and half its answer.
    records = [
        (64, 16, 0.05, 0.08), (64, 1, 0.05, 0.05), (1024, 16, None, 0.2),
        (1024, 16, 0.1, float("nan")), (4096, 16, 0.4, 0.4), (None, 16, 0.1, 0.2),
    ]  # fmt: skip
    (lone,) = lone_decodes(records)
    assert lone == DecodeSample(1, 72, pytest.approx(0.002), alone=True)  # type: ignore[arg-type]


def test_a_calibrated_scenario_keeps_what_was_measured() -> None:
    cal = fit(*samples(noise=0.05), CONFIG)
    what = calibrated_scenario(cal, parse_settings(["max_num_seqs=4", "prompt_tokens=100"]))
    assert what.config.max_num_seqs == 4 and what.config.num_blocks == 511
    assert what.api_s == cal.api_s and what.source.startswith("calibrated")
    assert what.residuals == (cal.residual_low, cal.residual_high)
    small = calibrated_scenario(
        cal, parse_settings(["num_gpu_blocks_override=65", "max_model_len=2048"])
    )
    assert small.config.num_blocks == 64 and small.config.max_model_len == 2048
    with pytest.raises(InvalidInput, match="kv_cache_dtype cannot change"):
        calibrated_scenario(cal, parse_settings(["kv_cache_dtype=fp8"]))
    # Prompts longer than any measured are flagged as an extrapolation.
    long = calibrated_scenario(cal, parse_settings(["prompt_tokens=6000", "output_tokens=4"]))
    assert any("calibrated up to 4,096" in f for f in predict(long, 0.1).extrapolation)
    # The API's time is in TTFT: a lone request's TTFT is it plus its prefill (two chunks of
    # the 512-token budget).
    lone = ["prompt_tokens=1024", "output_tokens=2", "num_requests=3", "arrival=constant"]
    one = calibrated_scenario(cal, parse_settings(lone))
    ttft = predict(one, 0.1).ttft_s.p50
    cost = cal.cost()
    first, second = pairs_of(512, 0), pairs_of(512, 512)
    prefill = cost.step_s(512, 512, 1, first) + cost.step_s(512, 1024, 1, second)
    assert ttft == pytest.approx(cal.api_s + prefill, rel=0.006)


def test_from_three_runs_checked_since_the_tune_a_prediction_is_at_their_scale() -> None:
    """The runs after a calibration ran their steps at a level of its own (BQ-BZ: medians
    x0.46 to x1.48): from three checks since the tune on, a prediction takes its step cost
    at their geometric mean, and its interval draws its drift around that. Checks from
    before the tune measured another cost and do not count."""
    now = 1_000_000.0
    cal = fit(*samples(), CONFIG).model_copy(
        update={"target": "cpu", "fitted_at": now - 900, "tuned_at": now - 600}
    )
    lone = parse_settings(["prompt_tokens=64", "output_tokens=32", "num_requests=3"])

    def ran(*drifts: float, at: float = now - 300) -> list[Check]:
        return [Check(at=at + i, drift=d, run=f"latency run {i}") for i, d in enumerate(drifts)]

    before = ran(2.0, 2.0, 2.0, at=now - 800)  # (checks of the cost before the tune)
    two = cal.model_copy(update={"checks": [*before, *ran(1.3, 1.2)]})
    assert two.checked_scale() == 1.0
    as_fitted = calibrated_scenario(two, lone)
    assert as_fitted.cost == cal.cost() and as_fitted.drifts == (1.3, 1.2)
    assert "predicted at" not in two.describe(now)
    three = cal.model_copy(update={"checks": [*before, *ran(1.3, 1.2, 1.25)]})
    scale = (1.3 * 1.2 * 1.25) ** (1 / 3)
    assert three.checked_scale() == pytest.approx(scale)
    what = calibrated_scenario(three, lone)
    assert what.cost == cal.cost().scaled(three.checked_scale())
    # The drifts are against the cost so taken: centred on 1, spread as they were.
    assert np.mean(np.log(what.drifts)) == pytest.approx(0, abs=1e-12)
    assert what.drifts[0] / what.drifts[1] == pytest.approx(1.3 / 1.2)
    assert f"predicted at x{scale:.2f} of this cost, as the 3 runs checked since" in what.source
    # A lone request decodes at the scaled cost: its TPOT as many times as long.
    tpot = predict(what, 0.1).tpot_s.p50
    plain = predict(as_fitted, 0.1).tpot_s.p50
    assert tpot is not None and plain is not None
    assert tpot / plain == pytest.approx(scale, rel=0.01)


def test_tuning_on_an_open_loop_run_finds_what_load_adds() -> None:
    quiet = fit(*samples(), CONFIG)
    rate = load_rate(quiet)
    assert rate > 0
    # The "engine" under load: every step half as long again, 8 ms more in the API.
    loaded = StepCost(0.004 * 1.5, 0.0, 0.0, 3e-6 * 1.5, True, 1.2e-4 * 1.5, 3e-8 * 1.5)
    scenario = Scenario(CONFIG, loaded, FixedProfile(prompt_tokens=256, output_tokens=64), 300)
    requests = list(traffic(scenario.profile, Arrival(rate=rate), 300, seed=4))
    results = list(simulate(requests, CONFIG, loaded))
    tpot = float(np.median([r.tpot_s for r in results if r.tpot_s is not None]))
    ttft = float(np.median([r.ttft_s for r in results if r.ttft_s is not None])) + API_S + 0.008
    tuned = tune(quiet, requests, rate, tpot, ttft)
    assert tuned.load_scale == pytest.approx(1.5, rel=0.05)
    assert tuned.request_s == pytest.approx(API_S + 0.008, abs=0.002)
    assert f"open-loop run at {rate:g} req/s" in tuned.describe()
    assert tuned.cost().seq_s == pytest.approx(quiet.seq_s * tuned.load_scale)
    with pytest.raises(InvalidInput, match="two tokens"):
        tune(quiet, [SimRequest(0.0, 100, 1)], rate, tpot, ttft)


def test_a_run_on_another_engine_is_tuned_on_that_engine() -> None:
    """A run on a small KV cache waits for blocks and recomputes preempted requests: tuned
    on the engine fitted on, whose cache never fills, those waits read as slower steps and a
    slower API; tuned on the run's own engine, they are the scheduler's."""
    quiet = fit(*samples(), CONFIG)
    small = replace(CONFIG, num_blocks=95, max_model_len=2048)
    loaded = StepCost(0.004 * 1.5, 0.0, 0.0, 3e-6 * 1.5, True, 1.2e-4 * 1.5, 3e-8 * 1.5)
    profile = FixedProfile(prompt_tokens=256, output_tokens=512)
    requests = list(traffic(profile, Arrival(rate=1.5), 120, seed=4))
    stats = EngineStats()
    results = list(simulate(requests, small, loaded, stats))
    assert stats.preemptions > 10  # (the cache is small enough to matter)
    tpot = float(np.mean([r.tpot_s for r in results if r.tpot_s is not None]))
    ttft = float(np.median([r.ttft_s for r in results if r.ttft_s is not None])) + API_S
    assert ttft > 0.2  # (most requests waited for blocks)
    own = tune(quiet, requests, 1.5, tpot, ttft, config=small)
    assert own.load_scale == pytest.approx(1.5, rel=0.03)
    # (a TTFT p50 on a steep queue: a per cent of scale moves it by more than the API's time)
    assert own.request_s < API_S + 0.01
    elsewhere = tune(quiet, requests, 1.5, tpot, ttft)
    assert elsewhere.load_scale > 1.5 * 1.1
    assert elsewhere.request_s > 0.2


def busy_steps(
    sends: list[float], arrival_s: float, drain: float = 1.0, seed: int = 0
) -> list[ObservedStep]:
    """A full batch's steps back to back from the first send until 10 s after the last, as
    the client would see them: 3 ms each with 5 % jitter (`drain` times that after the
    last send), every tenth step admitting a prompt; each send lengthens the step it falls
    in by `arrival_s`."""
    rng = np.random.default_rng(seed)
    at, i = sends[0], 0
    steps: list[ObservedStep] = []
    while at < sends[-1] + 10:
        host = 1.0 if at <= sends[-1] else drain
        end = at + 0.003 * host * (1 + 0.05 * rng.standard_normal())
        while i < len(sends) and sends[i] < end:  # (one arriving mid-step lengthens it)
            end += arrival_s if sends[i] >= at else 0.0
            i += 1
        admits = len(steps) % 10 == 9
        steps.append(
            ObservedStep(end, end - at, 7 if admits else 8, 8 * 300, (256,) if admits else ())
        )
        at = end
    return steps


@pytest.mark.parametrize("drain", [0.8, 1.0, 1.3])
def test_the_host_speed_against_the_drain_is_read_from_steps_with_nothing_sent_near(
    drain: float,
) -> None:
    """Steps that began with no send near them, while requests arrived, against the
    drain's: the host's speed between the two, whatever the arrivals take from the rest."""
    sends = [100.0 + t for t in Arrival(rate=50.0).within(20.0, seed=5)]
    ratio, how = host_drift(busy_steps(sends, 0.002, drain), sends, CONFIG.max_num_seqs)
    assert ratio == pytest.approx(1 / drain, rel=0.02)
    assert how.startswith("a full batch's steps with nothing sent near them took ")
    assert " ms in the drain (" in how


def test_steps_that_cannot_tell_the_host_speed_say_why() -> None:
    sends = [100.0 + t for t in Arrival(rate=50.0).within(20.0, seed=5)]
    steps = busy_steps(sends, 0.001)
    ratio, why = host_drift(steps, sends, 9)  # (never a full batch of 9)
    assert ratio is None and why == "its answers show no step of a full batch"
    # The same sends on another clock than the steps' leave no step beside them.
    ratio, why = host_drift(steps, [t - 100 for t in sends], CONFIG.max_num_seqs)
    assert ratio is None and why.startswith("0 steps of a full batch began while requests")
    assert why.endswith("each needs 100")
    crowded = [100.0 + t for t in Arrival(rate=2000.0).within(20.0, seed=5)]
    ratio, why = host_drift(busy_steps(crowded, 0.0), crowded, CONFIG.max_num_seqs)
    assert ratio is None and why.endswith("each needs 100")


@pytest.mark.parametrize("arrival_s", [0.0, 0.001, 0.003])
def test_the_cost_of_an_arrival_is_read_from_the_drain_past_the_knee(
    arrival_s: float,
) -> None:
    """Past the knee the requests that decode while others arrive run slower than those
    of the queue's drain by what the arrivals take: the run says what each arrival cost."""
    truth = replace(TRUE, arrival_s=arrival_s)
    rate = 2 * capacity_rps(
        Scenario(CONFIG, truth, FixedProfile(prompt_tokens=256, output_tokens=64), 300)
    )
    stream = list(
        traffic(
            FixedProfile(prompt_tokens=256, output_tokens=64),
            Arrival(rate=rate),
            int(rate * 20),
            seed=3,
        )
    )
    results = {id(r.request): r for r in simulate(stream, CONFIG, truth)}
    measured = [(results[id(r)].ttft_s or 0.0, results[id(r)].e2e_s or 0.0) for r in stream]
    cost, how = arrival_cost(stream, measured, CONFIG.max_num_seqs)
    assert cost == pytest.approx(arrival_s, abs=0.0002)
    assert " req/s arrived" in how and "in the drain" in how


def test_a_host_that_slowed_for_the_drain_is_taken_out_of_the_cost_of_an_arrival() -> None:
    """The drain 25 % slower than the arrivals' seconds (a shared host) reads as no cost at
    all; taken at the arriving side's host speed, it reads what each arrival took."""
    truth = replace(TRUE, arrival_s=0.001)
    profile = FixedProfile(prompt_tokens=256, output_tokens=64)
    rate = 2 * capacity_rps(Scenario(CONFIG, truth, profile, 300))
    stream = list(traffic(profile, Arrival(rate=rate), int(rate * 20), seed=3))
    slowing = HostSpeed(5.0, (1.0,) * 4 + (1.25,) * 20)  # (from the last send on)
    results = {id(r.request): r for r in simulate(stream, CONFIG, truth, speed=slowing)}
    measured = [(results[id(r)].ttft_s or 0.0, results[id(r)].e2e_s or 0.0) for r in stream]
    assert arrival_cost(stream, measured, CONFIG.max_num_seqs)[0] == 0.0
    cost, how = arrival_cost(stream, measured, CONFIG.max_num_seqs, drift=1 / 1.25)
    assert cost == pytest.approx(0.001, abs=0.0002)
    assert how.endswith(", the drain's taken x0.800 for the host")


def test_a_run_past_the_knee_without_a_drain_prices_nothing_and_says_why() -> None:
    light = [SimRequest(1.0 * i, 256, 64) for i in range(60)]
    results = list(simulate(light, CONFIG, TRUE))
    measured = [(r.ttft_s or 0.0, r.e2e_s or 0.0) for r in results]
    cost, why = arrival_cost(light, measured, CONFIG.max_num_seqs)
    assert cost is None and "the engine kept up: no queue to drain" in why
    with pytest.raises(InvalidInput, match="2 measured latencies for 60 requests"):
        arrival_cost(light, measured[:2], CONFIG.max_num_seqs)
    # A drain slower than the arrivals (a host that slowed down): nothing to charge.
    burst = [SimRequest(0.02 * i, 256, 64) for i in range(400)]  # (8 s at 50 req/s)
    slowing = HostSpeed(8.0, (1.0, 1.5, 1.5, 1.5))
    slowed = {id(r.request): r for r in simulate(burst, CONFIG, TRUE, speed=slowing)}
    measured = [(slowed[id(r)].ttft_s or 0.0, slowed[id(r)].e2e_s or 0.0) for r in burst]
    assert arrival_cost(burst, measured, CONFIG.max_num_seqs)[0] == 0.0


def test_a_run_without_a_drain_leaves_the_full_batch_as_tuned() -> None:
    cal = fit(*samples(), CONFIG)
    light = [SimRequest(1.0 * i, 256, 64) for i in range(60)]
    measured = [(r.ttft_s or 0.0, r.e2e_s or 0.0) for r in simulate(light, CONFIG, TRUE)]

    def never(_: Calibration) -> Calibration:
        raise AssertionError("nothing to tune again for")

    assert full_batch(cal, light, measured, never) == cal


def test_a_calibration_stored_with_a_queued_scale_reads_as_unmeasured_past_the_knee() -> None:
    """Stored calibrations from before the arrival cost carry `queued_scale`, which does
    not convert: they load, with nothing measured past the knee."""
    cal = fit(*samples(), CONFIG)
    old = {**cal.model_dump(), "queued_scale": 1.17, "saturated_rate": 64.0}
    del old["arrival_s"]
    loaded = Calibration.model_validate(old)
    assert (loaded.arrival_s, loaded.saturated_rate) == (0.0, None)
    assert loaded == cal
    with pytest.raises(ValueError, match="extra"):
        Calibration.model_validate({**cal.model_dump(), "queued": 1.0})


def test_what_the_replay_does_not_explain_is_kept_as_host_noise_and_predicted() -> None:
    """An engine that stalls one request in twenty by 300 ms: the tuned calibration keeps
    the stalls, and a prediction with them has the engine's p99 where one without has none."""
    quiet = fit(*samples(), CONFIG)
    rate = load_rate(quiet)
    scenario = Scenario(CONFIG, TRUE, FixedProfile(prompt_tokens=256, output_tokens=64), 240)
    requests = list(traffic(scenario.profile, Arrival(rate=rate), 240, seed=4))
    results = {id(r.request): r for r in simulate(requests, CONFIG, TRUE)}
    stall = [0.3 if i % 20 == 7 else 0.0 for i in range(len(requests))]
    measured = [
        (results[id(q)].ttft_s + API_S + s, results[id(q)].e2e_s + API_S + s)  # type: ignore[operator]
        for q, s in zip(requests, stall, strict=True)
    ]
    ttfts = sorted(t for t, _ in measured)
    tpot = float(np.median([r.tpot_s for r in results.values() if r.tpot_s is not None]))
    tuned = tune(quiet, requests, rate, tpot, ttfts[len(ttfts) // 2], measured)
    # More requests than NOISE_SAMPLES are taken evenly: every third of 600.
    many = list(traffic(scenario.profile, Arrival(rate=rate), 600, seed=5))
    sim = list(simulate(many, CONFIG, TRUE))
    exact = {id(r.request): (r.ttft_s + API_S, r.e2e_s + API_S) for r in sim}  # type: ignore[operator]
    assert len(tune(quiet, many, rate, tpot, ttfts[120], [exact[id(q)] for q in many]).noise) == 200
    residual = np.array([t for t, _ in tuned.noise])
    assert len(tuned.noise) == len(requests)
    assert np.median(residual) == pytest.approx(0.0, abs=0.003)
    assert (residual > 0.25).mean() == pytest.approx(1 / 20, abs=0.01)
    assert "host noise from its 240 requests" in tuned.describe()
    # Predicted on fresh traffic: the stalls reach p99 (and E2E with them), not p50.
    noisy = calibrated_scenario(
        tuned, parse_settings(["num_requests=400", "prompt_tokens=256", "output_tokens=64"])
    )
    bare = replace(noisy, noise=())
    with_noise, without = predict(noisy, rate, seed=1), predict(bare, rate, seed=1)
    assert without.ttft_s.p99 < 0.1 < with_noise.ttft_s.p99  # type: ignore[operator]
    assert with_noise.ttft_s.p50 == pytest.approx(without.ttft_s.p50, rel=0.1)
    assert with_noise.e2e_s.p99 > without.e2e_s.p99 + 0.2  # type: ignore[operator]
    assert predict(noisy, rate, seed=1) == with_noise  # seeded
    with pytest.raises(InvalidInput, match="3 measured latencies for 240"):
        tune(quiet, requests, rate, tpot, ttfts[120], measured[:3])


def test_a_later_runs_host_noise_is_read_at_its_own_drift() -> None:
    """A later run on a host 1.25 times slower that stalls one request in twenty by 300 ms:
    replayed at the calibration's cost times the run's drift, what is left is the stalls,
    not the slowdown (at the calibration's own cost every residual would carry it)."""
    quiet = fit(*samples(), CONFIG)
    rate = load_rate(quiet)
    profile = FixedProfile(prompt_tokens=256, output_tokens=64)
    requests = list(traffic(profile, Arrival(rate=rate), 300, seed=6))
    slower = replace(TRUE, overhead_s=TRUE.overhead_s * 1.25,
                     token_compute_s=TRUE.token_compute_s * 1.25, seq_s=TRUE.seq_s * 1.25,
                     pair_s=TRUE.pair_s * 1.25)  # fmt: skip
    results = {id(r.request): r for r in simulate(requests, CONFIG, slower)}
    stall = [0.3 if i % 20 == 7 else 0.0 for i in range(len(requests))]
    measured = [
        (results[id(q)].ttft_s + API_S + s, results[id(q)].e2e_s + API_S + s)  # type: ignore[operator]
        for q, s in zip(requests, stall, strict=True)
    ]
    tpot = float(np.mean([r.tpot_s for r in results.values() if r.tpot_s is not None]))
    drift = drift_of(quiet, requests, tpot)
    assert drift == pytest.approx(1.25, rel=0.03)
    noise = np.array(noise_of(quiet, requests, measured, drift))
    assert CHECK_NOISE_SAMPLES < 300 and len(noise) == 100  # (every third, evenly taken)
    assert np.median(noise[:, 1]) == pytest.approx(0.0, abs=0.01)
    assert (noise[:, 0] > 0.25).mean() == pytest.approx(1 / 20, abs=0.02)
    unscaled = np.array(noise_of(quiet, requests, measured, 1.0))
    assert np.median(unscaled[:, 1]) > np.median(noise[:, 1]) + 0.02  # (the slowdown)
    with pytest.raises(InvalidInput, match="3 measured latencies for 300"):
        noise_of(quiet, requests, measured[:3], drift)


def test_the_spread_of_tpots_where_the_queue_stood_is_measured_and_predicted() -> None:
    """An engine past the knee whose requests decode 0.7, 1 or 1.3 times as long as its
    steps say, by turns: the run past the knee gives that spread (its mean 1), and a prediction
    with it spreads the TPOTs where requests queued as the engine's were (their mean kept),
    E2E with them, and changes nothing where none queued."""
    cal = fit(*samples(), CONFIG).model_copy(update={"load_scale": 1.0})
    profile = FixedProfile(prompt_tokens=256, output_tokens=64)
    rate = 2 * capacity_rps(Scenario(CONFIG, cal.cost(), profile, 300))
    stream = list(traffic(profile, Arrival(rate=rate), int(rate * 20), seed=3))
    results = {id(r.request): r for r in simulate(stream, CONFIG, cal.cost())}
    factor = [(0.7, 1.0, 1.3)[i % 3] for i in range(len(stream))]
    measured = []
    for req, k in zip(stream, factor, strict=True):
        r = results[id(req)]
        assert r.ttft_s is not None and r.e2e_s is not None
        measured.append((r.ttft_s, r.ttft_s + (r.e2e_s - r.ttft_s) * k))
    spread = queued_spread(cal, stream, measured)
    assert 30 <= len(spread) <= 256 and np.mean(spread) == pytest.approx(1.0, abs=0.01)
    assert sorted({round(x, 2) for x in spread}) == [0.7, 1.0, 1.3]
    assert queued_spread(cal, stream[:50], measured[:50]) == []  # (too few to tell)
    cal = cal.model_copy(update={"queued_tpot": spread, "saturated_rate": rate})
    assert "a TPOT where the queue stood x0.70 to x1.30" in cal.describe()
    spread_scenario = calibrated_scenario(
        cal, parse_settings(["num_requests=600", "prompt_tokens=256", "output_tokens=64"])
    )
    plain = replace(spread_scenario, queued_tpot=())
    capacity = capacity_rps(plain)
    above = [predict(s, 1.3 * capacity, seed=2) for s in (spread_scenario, plain)]
    assert above[0].tpot_s.p95 > 1.2 * above[1].tpot_s.p95  # type: ignore[operator]
    assert above[0].tpot_s.mean == pytest.approx(above[1].tpot_s.mean, rel=0.03)
    assert above[0].e2e_s.max > above[1].e2e_s.max  # type: ignore[operator]
    assert above[0].ttft_s == above[1].ttft_s  # (the queue is the simulator's)
    lone = [predict(s, 0.01 * capacity, seed=2) for s in (spread_scenario, plain)]
    assert lone[0] == lone[1]


def test_the_quiet_fit_reads_a_sweep_and_lone_requests() -> None:
    decodes, prefills = samples()
    sweep = Sweep.model_validate(
        {"steps": [{"concurrency": d.batch, "tpot_s": {"p50": d.itl_s}} for d in decodes]}
    )
    lone = [(p.prompt_tokens, 16, p.ttft_s, p.ttft_s + 15 * 0.002) for p in prefills]
    assert quiet_fit(sweep, lone, CONFIG) == fit(decodes + lone_decodes(lone), prefills, CONFIG)


def test_the_hosts_speed_is_measured_window_by_window_and_drawn_by_predictions() -> None:
    """An engine whose steps run 1.4 times as long from 10 s to 20 s of a run: the tuned
    calibration finds those two windows 1.4 times as slow as the others, the windows
    averaging 1 (the tune matched the mean), and a prediction near the knee that draws
    windows from them has a longer tail than one that does not (seeded: the same seed, the
    same prediction)."""
    quiet = fit(*samples(), CONFIG)
    rate = load_rate(quiet)
    scenario = Scenario(CONFIG, TRUE, FixedProfile(prompt_tokens=256, output_tokens=64), 240)
    requests = list(traffic(scenario.profile, Arrival(rate=rate), 240, seed=4))
    host = HostSpeed(SPEED_WINDOW_S, (1.0, 1.0, 1.4, 1.4) + (1.0,) * 20)
    results = {id(r.request): r for r in simulate(requests, CONFIG, TRUE, speed=host)}
    measured = [
        (results[id(q)].ttft_s + API_S, results[id(q)].e2e_s + API_S)  # type: ignore[operator]
        for q in requests
    ]
    tpot = float(np.mean([r.tpot_s for r in results.values() if r.tpot_s is not None]))
    ttft = float(np.median([t for t, _ in measured]))
    tuned = tune(quiet, requests, rate, tpot, ttft, measured)
    assert len(tuned.speed) >= 5
    assert np.mean(tuned.speed) == pytest.approx(1.0)
    fast = min(tuned.speed)
    slow = [f for f in tuned.speed if f > 1.2 * fast]
    assert len(slow) == 2 and all(f == pytest.approx(1.4 * fast, rel=0.08) for f in slow)
    assert all(f == pytest.approx(fast, rel=0.05) for f in tuned.speed if f <= 1.2 * fast)
    assert f"host speed x{fast:.2f} to x{max(slow):.2f}" in tuned.describe()
    # The replay at the run's own speed explains the slow windows: the E2E residuals'
    # 90th percentile is a third of what a replay at one speed leaves.
    unexplained = np.quantile([abs(e) for _, e in tuned.noise], 0.9)
    still_host = tuned.cost()  # (the same step cost at one speed)
    flat = {id(r.request): r.e2e_s or 0.0 for r in simulate(requests, CONFIG, still_host)}
    flat_e2e = [
        m[1] - flat[id(q)] - tuned.request_s for q, m in zip(requests, measured, strict=True)
    ]
    assert unexplained < np.quantile(np.abs(flat_e2e), 0.9) / 3
    near_knee = calibrated_scenario(
        tuned, parse_settings(["num_requests=600", "prompt_tokens=256", "output_tokens=64"])
    )
    steady = replace(near_knee, speed=())
    knee = 0.9 * capacity_rps(steady)
    moving, still = predict(near_knee, knee, seed=2), predict(steady, knee, seed=2)
    assert moving.ttft_s.p99 > 1.2 * still.ttft_s.p99  # type: ignore[operator]
    assert predict(near_knee, knee, seed=2) == moving
    # Too few requests a window: no speed is measured, and the calibration says none.
    few = requests[::60]
    sparse = tune(quiet, few, rate, tpot, ttft, [measured[i] for i in range(0, 240, 60)])
    assert sparse.speed == [] and "host speed" not in sparse.describe()


def test_a_replay_can_run_at_the_host_speed_its_run_had() -> None:
    """The fidelity benchmark's scheduler-only figures: a run tuned on itself and replayed on
    its own requests at the host's speed it had, window by window (`host_speed` in the run's
    order), finds its slow windows where they were; the same replay at one speed does not."""
    quiet = fit(*samples(), CONFIG)
    rate = load_rate(quiet)
    profile = FixedProfile(prompt_tokens=256, output_tokens=64)
    requests = list(traffic(profile, Arrival(rate=rate), 240, seed=4))
    host = HostSpeed(SPEED_WINDOW_S, (1.0, 1.0, 1.5, 1.5) + (1.0,) * 20)
    ran = {id(r.request): r for r in simulate(requests, CONFIG, TRUE, speed=host)}
    measured = [(ran[id(q)].ttft_s or 0.0, ran[id(q)].e2e_s or 0.0) for q in requests]
    tpot = float(np.mean([r.tpot_s for r in ran.values() if r.tpot_s is not None]))
    own = tune(quiet, requests, rate, tpot, float(np.median([t for t, _ in measured])))
    flat = {id(r.request): r for r in simulate(requests, CONFIG, own.cost())}
    _, in_order = host_speed(requests, flat, measured)
    assert in_order is not None
    scenario = Scenario(CONFIG, own.cost(), profile, 240, api_s=own.request_s)
    truth = float(np.percentile([e for _, e in measured], 99))
    as_run = predict(scenario, rate, requests=requests, speed=in_order).e2e_s.p99
    at_one_speed = predict(scenario, rate, requests=requests).e2e_s.p99
    assert as_run is not None and at_one_speed is not None
    # (a request's window is the one it began decoding in: the slow ones read a little slower)
    assert as_run == pytest.approx(truth, rel=0.1)
    assert at_one_speed < 0.85 * truth


def test_a_tuning_run_that_queued_is_refused_with_the_reason() -> None:
    """A host-bound CPU engine queued for seconds at 40 % of its quiet fit's capacity, and
    the tune put the queue into the API's time (+1.8 s) and the steps (x2.7): such a run
    is refused (and made again at half the rate), one that barely queued is kept."""

    def run(ttft: float | None, queue: float | None, tpot: float | None = 0.005) -> LoadRun:
        engine = None if queue is None else {"queue_time": {"mean": queue}}
        return LoadRun.model_validate(
            {"ttft_s": {"p50": ttft}, "tpot_s": {"p50": tpot}, "engine": engine}
        )

    why = tuning_refused(run(2.6, 1.96))
    assert why is not None and "1,960 ms in the engine's queue" in why and "2,600 ms" in why
    assert tuning_refused(run(0.11, 0.02)) is None
    assert tuning_refused(run(0.11, None)) is None  # not vLLM: no queue time to read
    # Every request failed, or none had a second token: nothing to tune on.
    for empty in (run(None, None, None), run(0.11, 0.0, None)):
        assert tuning_refused(empty) == "had no request answered with two tokens or more"


def test_the_tuning_rate_is_no_more_than_the_sweep_completed() -> None:
    """The quiet fit counts the engine's steps; the sweep's closed loop completed what the
    host (API server and client too) could: the tuning run's rate is a share of the lesser."""
    quiet = fit(*samples(), CONFIG)
    fitted = load_rate(quiet)

    def sweep(*completed: float) -> Sweep:
        steps = [{"concurrency": 2**i, "requests_per_s": r} for i, r in enumerate(completed)]
        return Sweep.model_validate({"steps": steps})

    assert load_rate(quiet, sweep(1.0, 2.5, 2.0)) == round(0.4 * 2.5, 2) < fitted
    assert load_rate(quiet, sweep(1e6)) == fitted == load_rate(quiet, sweep())


def test_a_sweep_whose_answers_came_in_bursts_is_refused() -> None:
    """The batch sweep beside a CPU hog (concurrency 1 and 8 as measured): TPOT p50 a
    fraction of the answers' time from first token to last."""
    starved = Sweep.model_validate({"steps": [
        {"concurrency": 1, "tpot_s": {"p50": 5.8e-05}, "ttft_s": {"p50": 0.158},
         "e2e_s": {"p50": 0.222}},
        {"concurrency": 8, "tpot_s": {"p50": 0.000146}, "ttft_s": {"p50": 0.405},
         "e2e_s": {"p50": 0.795}},
    ]})  # fmt: skip
    why = bursts(starved)
    assert why is not None and "concurrency 1" in why and "0.06 ms against 1.02 ms" in why
    steady = Sweep.model_validate({"steps": [
        {"concurrency": 4, "tpot_s": {"p50": 0.0049}, "ttft_s": {"p50": 0.05},
         "e2e_s": {"p50": 0.36}},
    ]})  # fmt: skip
    assert bursts(steady) is None


def test_a_calibration_says_how_long_ago_it_was_fitted_and_tuned() -> None:
    decodes, prefills = samples()
    cal = fit(decodes, prefills, CONFIG)
    now = 1_000_000.0
    assert "ago" not in cal.describe(now)  # no time on record: nothing claimed
    old = cal.model_copy(update={"fitted_at": now - 3 * 86400, "tuned_at": now - 3 * 86400})
    assert old.describe(now).endswith("; fitted 3 days ago")
    assert "ago" not in old.describe()  # without `now`: no age
    retuned = old.model_copy(update={"tuned_at": now - 20 * 60})
    assert retuned.describe(now).endswith("; fitted 3 days ago, tuned 20 min ago")
    fresh = cal.model_copy(update={"fitted_at": now - 10, "tuned_at": now - 10})
    assert fresh.describe(now).endswith("; fitted under a minute ago")
    # An hour on, the tune is worth making again; a retune makes the hint go.
    hint = retune_hint(old.model_copy(update={"target": "cpu"}), now)
    assert hint is not None and "tuned 3 days ago" in hint
    assert "kvscope simulate calibrate --target cpu --retune" in hint
    assert retune_hint(retuned, now) is None and retune_hint(fresh, now) is None
    assert retune_hint(cal, now) is None  # no time on record
    # However young the tune, three runs checked since, all off the same way, call for one.
    ran = [Check(at=now - 600 + i, drift=d, run=f"latency run {i}") for i, d in
           enumerate((1.3, 1.15, 1.12, 1.2))]  # fmt: skip
    slow = fresh.model_copy(update={"tuned_at": now - 900, "checks": ran, "target": "cpu"})
    hint = retune_hint(slow, now)
    assert hint is not None and "ran the steps x1.12 to x1.20 as long as calibrated" in hint
    assert "--target cpu --retune" in hint
    mixed = slow.model_copy(
        update={"checks": [*ran[:3], ran[3].model_copy(update={"drift": 0.95})]}
    )
    assert retune_hint(mixed, now) is None
    before = slow.model_copy(update={"tuned_at": now - 598.5})  # (two of them before the tune)
    assert retune_hint(before, now) is None


def test_runs_that_queued_drifting_apart_from_the_others_call_for_a_new_calibration() -> None:
    """BM: the calibration's drain past the knee ran in a slow spell, so its full batch
    cost too much; the runs checked since that queued read x0.88 and x0.89, the others
    x1.00 to x1.04. A retune keeps the full batch's cost: the hint is a new calibration."""
    decodes, prefills = samples()
    now = 1_000_000.0
    cal = fit(decodes, prefills, CONFIG).model_copy(
        update={"target": "cpu", "fitted_at": now - 900, "tuned_at": now - 900}
    )
    runs = [(1.02, False), (0.88, True), (1.00, False), (1.04, False), (0.89, True)]
    ran = [Check(at=now - 600 + i, drift=d, run=f"latency run {i}", queued=full)
           for i, (d, full) in enumerate(runs)]  # fmt: skip
    hint = retune_hint(cal.model_copy(update={"checks": ran}), now)
    assert hint is not None and "the cost of a full batch is off" in hint
    assert "runs that queued (their batches full) ran the steps x0.88 to x0.89" in hint
    assert "those that did not x1.00 to x1.04" in hint
    assert "kvscope simulate calibrate --target cpu (" in hint and "--retune" not in hint
    # One side with a single run, medians within DRIFTED, or checks stored before the
    # queue was kept: no call.
    assert retune_hint(cal.model_copy(update={"checks": ran[:4]}), now) is None
    close = [c.model_copy(update={"drift": 0.93}) if c.queued else c for c in ran]
    assert retune_hint(cal.model_copy(update={"checks": close}), now) is None
    unknown = [c.model_copy(update={"queued": None}) for c in ran]
    assert retune_hint(cal.model_copy(update={"checks": unknown}), now) is None
    # The runs checked before the tune do not count: a new tune has checks of its own.
    retuned = cal.model_copy(update={"checks": ran, "tuned_at": now - 600 + 1.5})
    assert retune_hint(retuned, now) is None


def test_a_tune_on_an_unsteady_host_calls_for_a_new_calibration() -> None:
    """BT's tuning run ran its 5-s windows x0.61 to x1.35 (BD and BQ-BT spanned 1.37-2.21
    and met 0-6 of 21 figures; the runs tuned within 1.15 met 7-20)."""
    decodes, prefills = samples()
    now = 1_000_000.0
    cal = fit(decodes, prefills, CONFIG).model_copy(
        update={"target": "cpu", "fitted_at": now - 60, "tuned_at": now - 60}
    )
    unsteady = cal.model_copy(update={"speed": [1.35, 0.92, 0.61, 1.04, 1.1, 0.98]})
    hint = retune_hint(unsteady, now)
    assert hint is not None
    assert hint.startswith("the tuning run's host ran x0.61 to x1.35 window to window, x2.21")
    assert "kvscope simulate calibrate --target cpu (" in hint and "--retune" not in hint
    steady = cal.model_copy(update={"speed": [0.94, 1.07, 1.0, 0.98, 1.02, 1.01]})
    assert retune_hint(steady, now) is None and retune_hint(cal, now) is None


def test_a_calibration_on_a_host_that_moved_since_the_previous_one_says_so() -> None:
    """BW's whole calibration ran in a slow spell, its runs after at a median x0.46 of it.
    A new calibration is set beside the previous one of the same engine, at the speed the
    previous one's latest checked runs ran: within x1.5 it says nothing."""
    decodes, prefills = samples()
    now = 1_000_000.0
    previous = fit(decodes, prefills, CONFIG).model_copy(
        update={"target": "cpu", "fitted_at": now - 3 * 3600, "tuned_at": now - 3 * 3600}
    )
    slow = previous.model_copy(update={"load_scale": 2.0})
    said = moved_since(previous, slow, now)
    assert said is not None and "the host ran slower while this one measured" in said
    rates = re.search(r"completes ([0-9.]+) req/s .* \(fitted 3 h ago\) said ([0-9.]+):", said)
    assert rates is not None and float(rates[2]) / float(rates[1]) == pytest.approx(2, rel=0.05)
    assert "at the speed" not in said
    assert moved_since(slow, previous, now) is not None  # (and faster)
    assert "the host ran faster" in str(moved_since(slow, previous, now))
    assert moved_since(previous, previous.model_copy(update={"load_scale": 1.3}), now) is None
    # The previous one's last three runs ran their steps twice as long as it said: the
    # host already ran at the new calibration's speed.
    runs = [Check(at=now - 3600 + i, drift=d, run=f"latency run {i}") for i, d in
            enumerate((1.0, 2.1, 1.9, 2.0))]  # fmt: skip
    checked = previous.model_copy(update={"checks": runs})
    assert moved_since(checked, slow, now) is None
    said = moved_since(checked, previous, now)
    assert said is not None and "at the speed its last 3 runs checked ran" in said
    assert "the host ran faster" in said
    # Another engine is another cost: not compared.
    other = slow.model_copy(update={"engine": {**slow.engine, "max_num_seqs": 4}})
    assert moved_since(previous, other, now) is None


def test_the_tune_matches_the_mean_tpot_which_stalls_lengthen_and_the_median_does_not() -> None:
    """One answer in ten stalled to three times its quiet TPOT: the median TPOT is the
    quiet one, the mean a fifth longer. The engine's throughput past the knee follows its
    mean step, so the tune scales the steps by the mean (x1.2), not by the median (x1.0)."""
    quiet = fit(*samples(), CONFIG)
    rate = load_rate(quiet)
    shape = FixedProfile(prompt_tokens=256, output_tokens=64)
    requests = list(traffic(shape, Arrival(rate=rate), 300, seed=4))
    results = [r for r in simulate(requests, CONFIG, TRUE) if r.tpot_s is not None]
    tpots = [r.tpot_s * (3.0 if i % 10 == 3 else 1.0) for i, r in enumerate(results)]  # type: ignore[operator]
    ttfts = [r.ttft_s + API_S for r in results]  # type: ignore[operator]
    run = LoadRun.model_validate(
        {
            "tpot_s": {"p50": float(np.median(tpots)), "mean": float(np.mean(tpots))},
            "ttft_s": {"p50": float(np.median(ttfts))},
        }
    )
    figures = run.tune_figures
    assert figures is not None
    assert figures == pytest.approx((np.mean(tpots), np.median(ttfts)))
    assert tune(quiet, requests, rate, *figures).load_scale == pytest.approx(1.2, rel=0.03)
    on_median = tune(quiet, requests, rate, float(np.median(tpots)), float(np.median(ttfts)))
    assert on_median.load_scale == pytest.approx(1.0, abs=0.03)
    # A summary stored before the mean was kept is tuned on its median.
    old = LoadRun.model_validate({"tpot_s": {"p50": 0.004}, "ttft_s": {"p50": 0.02}})
    assert old.tune_figures == (0.004, 0.02)


def observed(cost: StepCost, scale: float) -> list[ObservedStep]:
    """Steps as read back from a 256/64 run under load (every step `scale` times what
    `cost` says): 1-5 requests decoding, and 1-4 of them beside a finished 256-token
    prefill, 25 of each kind."""
    kinds = [(b, ()) for b in range(1, 6)] + [(b, (256,)) for b in range(1, 5)]
    out = []
    for decodes, prefills in kinds:
        step = ObservedStep(0.0, None, decodes, decodes * 300, prefills)
        seconds = scale * step.modelled_s(cost, CONFIG)
        out += [replace(step, seconds=seconds)] * 25
    return out


def test_steps_under_load_correct_a_quiet_fit_that_put_the_prefill_into_the_api_time() -> None:
    """Lone prompts whose prefill ran at 60 % of its cost beside a fixed API time: the quiet
    fit undercounts a prefill. Steps of a loaded run (x1.3) that finish a 256-token prefill
    among decodes measure it: fitted again with them, the cost says what those steps take
    (at the quiet speed, the tune's scale puts the load back), decodes included."""
    decodes, _ = samples()
    prefills = [
        PrefillSample(n, API_S + 0.6 * lone_ttft(n) + (0.4 * TRUE.overhead_s))
        for n in (64, 1024, 4096)
        for _ in "ab"
    ]
    quiet = fit(decodes, prefills, CONFIG)
    steps = observed(TRUE, 1.3)
    mixed = next(s for s in steps if s.prefills)
    truth = mixed.modelled_s(TRUE, CONFIG)
    assert mixed.modelled_s(quiet.cost(), CONFIG) < 0.9 * truth
    again = on_steps(quiet, steps)
    assert again.step_kinds == 9
    for step in steps[::25]:
        assert step.modelled_s(again.cost(), CONFIG) == pytest.approx(
            step.modelled_s(TRUE, CONFIG), rel=0.05
        )
    # Tuned with the steps, the calibration says so.
    rate = load_rate(quiet)
    requests = list(traffic(FixedProfile(prompt_tokens=256, output_tokens=64),
                            Arrival(rate=rate), 200, seed=4))  # fmt: skip
    results = [r for r in simulate(requests, CONFIG, TRUE) if r.tpot_s is not None]
    tpot = float(np.mean([r.tpot_s for r in results if r.tpot_s is not None]))
    ttft = float(np.median([r.ttft_s for r in results if r.ttft_s is not None])) + API_S
    assert (
        "fitted again with 9 kinds of its steps"
        in tune(quiet, requests, rate, tpot, ttft, steps=steps).describe()
    )


def test_steps_are_fitted_on_only_beside_the_quiet_rows_and_with_both_kinds() -> None:
    quiet = fit(*samples(), CONFIG)
    steps = observed(TRUE, 1.0)
    assert quiet.quiet_rows and len(quiet.quiet_s) == len(quiet.quiet_rows)
    # Stored before the rows were kept: nothing to fit beside.
    old = quiet.model_copy(update={"quiet_rows": [], "quiet_s": []})
    assert on_steps(old, steps) == old
    # No step finished a prefill, or too few of a kind: nothing to tell the prefill by.
    assert on_steps(quiet, [s for s in steps if not s.prefills]) == quiet
    assert on_steps(quiet, steps[::2]) == quiet  # 12 or 13 of each kind


def test_the_cost_of_a_token_count_is_read_from_lone_prompts_in_the_order_sent() -> None:
    """`shape_cost` runs the lone prompts' token counts through the engine's 32 plans in
    the order sent: a count never run, one run before but evicted, one kept; each kind's
    TTFT over the kept ones' is its cost, never below 0. The calibration's own order (24
    lengths, again, 24 others, the first again) meets all three; 40 counts in turn miss
    every time; too few new or kept cannot tell, too few evicted read 0."""
    cal = fit(*samples(), CONFIG)
    shape_s, replan_s = 0.0025, 0.0004

    def lone(
        order: list[int], kinds: list[str], paid: dict[str, float]
    ) -> list[tuple[int, int, float]]:
        return [(p, 2, API_S + lone_ttft(p) + paid[k]) for p, k in zip(order, kinds, strict=True)]

    paid = {"new": shape_s, "again": replan_s, "kept": 0.0}
    order = [p for part in (0, 0, 1, 0) for p in SHAPE_LENGTHS[part]]
    kinds = ["new"] * 24 + ["kept"] * 24 + ["new"] * 24 + ["again"] * 24
    assert [p for p, _ in SHAPE_PARAMS["profile"]["pairs"]] == order
    costs, how = shape_cost(cal, lone(order, kinds, paid))
    assert costs == pytest.approx((shape_s, replan_s), abs=1e-4)
    assert "48 lone prompts whose token count was never run" in how
    assert "of 24 whose count was kept" in how and "of 24 run before but not kept" in how
    cycle = list(range(330, 410, 2))  # (40 counts: each gone when it comes round again)
    thrash = [*cycle, *cycle, *[300] * 10]
    kinds = ["new"] * 40 + ["again"] * 40 + ["new"] + ["kept"] * 9
    assert shape_cost(cal, lone(thrash, kinds, paid))[0] == pytest.approx(
        (shape_s, replan_s), abs=1e-4
    )
    faster = {"new": 0.0, "again": 0.0, "kept": shape_s}  # (read 0, not below)
    assert shape_cost(cal, lone(thrash, kinds, faster))[0] == (0.0, 0.0)
    once = [*SHAPE_LENGTHS[0], *SHAPE_LENGTHS[0]]  # (none evicted)
    costs, how = shape_cost(cal, lone(once, ["new"] * 24 + ["kept"] * 24, paid))
    assert costs == pytest.approx((shape_s, 0.0), abs=1e-4)
    assert how.endswith("0 run before but not kept (too few to read: 0)")
    few = [300] * 20 + [400]
    assert shape_cost(cal, lone(few, ["new"] + ["kept"] * 19 + ["new"], paid)) == (
        None,
        "2 lone prompts needed plans never built and 19 found theirs kept; each kind needs 8",
    )
