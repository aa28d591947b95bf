"""The batch sweep, OOM, KV usage and capacity probes: their judgement on hand-made data,
and whole runs against the loopback stand-in (the real engine runs them in tests/e2e)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from planner.errors import InvalidInput
from planner.simulate import whatif
from planner.simulate.calibrate import fit
from probes.kinds import capacity, get_kind, latency, parse_params
from probes.kinds.batch_sweep import Step, find_knee, past_knee
from probes.kinds.calibration import save as save_calibration
from probes.kinds.context import ProbeContext, ProbeResult, SamplePoint
from probes.kinds.kv_usage import message, trend
from probes.kinds.oom import classify, kv_bound_wait, ran_together
from probes.kinds.runner import execute
from probes.load.generator import Percentiles, RequestResult
from probes.vllm.client import Target
from storage import queries as q
from storage.settings import Settings
from tests.planner.test_calibrate import CONFIG as CALIBRATED
from tests.planner.test_calibrate import samples
from tests.support.fake_openai import FakeConfig, serve


def _step(c: int, tps: float, e2e: float) -> Step:
    return Step(concurrency=c, output_tokens_per_s=tps, e2e_s=Percentiles(p50=e2e))


def _points(kv: list[float]) -> list[SamplePoint]:
    return [SamplePoint(t=float(t), ts=float(t), kv_usage=v) for t, v in enumerate(kv)]


def _run(kind: str, params: Any, url: str, **kwargs: Any) -> Any:
    """A whole probe against the stand-in; its typed result."""
    result: ProbeResult = asyncio.run(execute(get_kind(kind), params, Target(url), **kwargs))
    return result


def test_knee_is_where_throughput_stops_rising_but_latency_does_not() -> None:
    steps = [
        _step(1, 100, 1.0),
        _step(2, 190, 1.05),
        _step(4, 350, 1.15),
        _step(8, 370, 2.1),
        _step(16, 372, 4.3),
    ]
    knee = find_knee(steps)
    assert knee.concurrency == 4  # 350/1.15 is the best throughput per second of latency
    assert knee.gain == pytest.approx(370 / 350 - 1)
    assert knee.latency_growth == pytest.approx(2.1 / 1.15 - 1)
    assert "knee at concurrency 4: going to 8 adds +6% throughput but +83% E2E" in knee.message
    rising = find_knee(steps[:3])
    assert rising.concurrency is None and "no knee up to concurrency 4" in rising.message
    # Noise does not fool it: a dip in the middle is not a knee when the end is far better.
    noisy = [_step(1, 100, 1.0), _step(2, 95, 1.0), _step(4, 400, 1.1), _step(8, 420, 3.0)]
    assert find_knee(noisy).concurrency == 4


def _rec(status: str = "ok", http: int | None = 200, error: str | None = None) -> RequestResult:
    return RequestResult(0, 0.0, 0.0, 0.1, 0.2, 10, 2, status, http, "length", error, {}, [], {})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("records", "peaks", "pre", "outcome"),
    [
        ([_rec()] * 4, {"running": 4, "waiting": 0}, 0, "ok"),
        ([_rec()] * 4, {"running": 4, "waiting": 0}, 3, "kv_exhausted"),
        ([_rec()] * 4, {"running": 3, "waiting": 1, "kv_usage": 0.97}, 0, "ok"),  # admitted later
        ([_rec()] * 4, {"running": 2, "waiting": 0}, 0, "ok"),  # the sampler missed the peak
        (
            [_rec("error", 400, "This model's maximum context length is 2048 tokens. However")] * 2,
            {},
            0,
            "rejected_too_long",
        ),
        ([_rec("error", 500, "CUDA out of memory. Tried to allocate 2 GiB")], {}, 0, "engine_oom"),
        ([_rec("error", None, "the request timed out after 180 s")], {}, 0, "timeout"),
        ([_rec("error", 502, "bad gateway")], {}, 0, "errors"),
    ],
)
def test_oom_step_outcomes(
    records: list[RequestResult], peaks: dict[str, float | None], pre: float, outcome: str
) -> None:
    assert classify(records, 4, peaks, pre)[0] == outcome


def test_a_sequence_waiting_with_too_few_blocks_free_exhausts_the_cache() -> None:
    """vLLM queues a sequence it cannot hold rather than preempt when the batch reaches its
    scheduler spread out (a busy host): a step with no preemption still fails the cache."""

    def at(t: int, waiting: float | None, free: float | None) -> SamplePoint:
        return SamplePoint(t=t, ts=t, waiting=waiting, free_blocks=free)

    points = [at(0, 0, 500), at(1, 2, 300), at(2, 1, 40), at(3, 1, 3), at(4, 0, 2)]
    # 128 blocks a sequence: waiting beside 300 free is the prefill budget, not a limit.
    assert kv_bound_wait(points, 128) == 3  # the tightest moment
    assert kv_bound_wait(points, 40) == 3
    assert kv_bound_wait(points, 3) is None  # 3 free was enough; at t=4 nobody waited
    assert kv_bound_wait([at(0, None, 1), at(1, 1, None)], 128) is None  # gaps prove nothing
    records = [_rec()] * 4
    outcome, why = classify(records, 4, {"waiting": 1}, 0, 3, 128)
    assert outcome == "kv_exhausted"
    assert why.startswith("no preemption, but a sequence waited while 3 blocks were free of")
    outcome, why = classify(records, 4, {"waiting": 2}, 0, None, 128)
    assert outcome == "ok" and "no sample saw one short of KV blocks" in why
    assert classify(records, 4, {}, 2, 3, 128)[1].startswith("2 preemption(s)")


def test_an_oom_step_that_queued_a_sequence_for_kv_space_fails() -> None:
    params = parse_params(
        "oom",
        {"confirm": True, "batch": 2, "start_context": 512, "step": 512, "output_tokens": 8,
         "max_context": 1024},
    )  # fmt: skip
    # Over 600 prompt tokens, one request waits with 1 block free (of 32 or 64 needed).
    with serve(FakeConfig(metrics=True, queue_over_tokens=600, itl_s=0.02)) as fake:
        out = _run("oom", params, fake.url, managed=True)
    first, second = out.steps
    assert first.outcome == "ok" and first.kv_wait_free_blocks is None
    assert first.blocks_needed == 32  # 512 tokens in blocks of 16
    assert second.outcome == "kv_exhausted" and second.preemptions == 0
    assert (second.kv_wait_free_blocks, second.blocks_needed) == (1, 64)
    assert out.last_good_context == 512 and out.failure.context == 1024


def test_an_oom_step_whose_batch_never_ran_at_once_is_sent_again_and_not_proof() -> None:
    def rec(first: float | None, end: float | None) -> RequestResult:
        return dataclasses.replace(_rec(), first_token_ts=first, end_ts=end)

    assert ran_together([rec(1, 5), rec(2, 6), rec(4.9, 9)]) is True
    assert ran_together([rec(1, 5), rec(5.1, 6)]) is False  # one ended before the other began
    assert ran_together([rec(1, 5), rec(5.1, 6), rec(None, None)]) is False  # a failed one
    assert ran_together([rec(1, 5), rec(None, 2)]) is None  # nothing to compare with
    params = parse_params(
        "oom",
        {"confirm": True, "batch": 2, "start_context": 512, "step": 512, "output_tokens": 8,
         "max_context": 512},
    )  # fmt: skip
    with serve(FakeConfig(metrics=True, itl_s=0.005, one_at_a_time=True)) as fake:
        out = _run("oom", params, fake.url, managed=True)
    (step,) = out.steps
    assert step.outcome == "ok" and step.together is False and step.tries == 3
    assert fake.generations == 6  # three tries of two
    assert step.why.endswith("the batch never ran all at once (an answer ended before another "
                             "began), so the fit is not proven")  # fmt: skip


def test_kv_trend_is_a_slope_per_minute() -> None:
    points = _points([0.1 + 0.002 * t for t in range(60)])
    got = trend(points, 10, 50)
    assert got.slope_per_min == pytest.approx(0.12)
    assert got.slope_stderr_per_min == pytest.approx(0, abs=1e-12) and got.significant
    assert trend(points[:2], 0, 60).slope_per_min is None


def test_a_slope_inside_the_noise_is_not_called_a_creep() -> None:
    # Alternating 0 and 4% (requests come and go between samples): no trend, only noise.
    noisy = _points([0.04 * (t % 2) for t in range(12)])
    got = trend(noisy, 0, 11)
    assert got.slope_per_min != 0 and not got.significant
    said = message(got, 0.0, 0.0, True)
    assert said.startswith("no clear KV trend at a stable request rate")
    assert "within the noise of 12 samples" in said
    creep = trend(_points([0.1 + 0.002 * t for t in range(60)]), 10, 50)
    assert message(creep, 0.1, 0.3, False) == (
        "KV usage rose at a stable request rate: +12.0% ± 0.0% of the cache per minute; "
        "after the load it stayed at 30.0% (baseline 10.0%)"
    )


def test_capacity_brackets_then_bisects(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    async def fake_measure(
        ctx: ProbeContext,
        params: Any,
        rate: float,
        step: str,
        share: tuple[float, float] = (0, 1),
        attempt: int = 0,
    ) -> Any:
        attempts.append(attempt)
        inside = 0.95 if rate <= 5.3 else 0.5  # the SLO holds up to 5.3 req/s
        return SimpleNamespace(
            slo_share=inside,
            trustworthy=True,
            reason=None,
            requests=10,
            errors=0,
            ttft_s=Percentiles(),
            tpot_s=Percentiles(),
            requests_per_s=rate,
            by_class=[],
            engine=None,
        )

    monkeypatch.setattr(latency, "measure", fake_measure)
    params = parse_params(
        "capacity", {"ttft_slo_s": 1, "tpot_slo_s": 0.1, "share": 0.9, "iterations": 3}
    )
    ctx = ProbeContext(None, "m")  # type: ignore[arg-type]
    assert isinstance(params, capacity.Params)
    out = asyncio.run(capacity.run(ctx, params))
    assert [s.rate for s in out.steps] == [1, 2, 4, 8, 6, 5, 5.5]
    assert out.capacity_rps == 5 and out.first_failing_rps == 5.5
    assert "capacity 5 req/s" in out.message
    # Fresh prompts for every rate: repeats would be served from vLLM's prefix cache.
    assert attempts == list(range(7))


def fake_rates(
    monkeypatch: pytest.MonkeyPatch,
    capacity_rps: float,
    tpot_s: float | None = None,
    late_first: bool = False,
) -> list[float]:
    """Latency runs that hold at and below `capacity_rps` and break above it, each with
    `tpot_s` as its TPOT p50 (the first sent late with `late_first`); the rates tried."""
    return fake_measure(
        monkeypatch,
        lambda rate, attempt: (
            0.95 if rate <= capacity_rps else 0.4,
            tpot_s,
            not (late_first and attempt == 0),
        ),
    )


Answer = tuple[float | None, float | None, bool] | tuple[float | None, float | None, bool, float]


def fake_measure(
    monkeypatch: pytest.MonkeyPatch, answer: Callable[[float, int], Answer]
) -> list[float]:
    """Latency runs answered by `answer(rate, attempt)`: (share inside the SLO, the client's
    TPOT p50, sender on time[, the engine's own TPOT mean]); the rates tried."""
    tried: list[float] = []

    async def measure(
        ctx: ProbeContext, params: Any, rate: float, step: str,
        share: tuple[float, float] = (0, 1), attempt: int = 0,
    ) -> Any:  # fmt: skip
        tried.append(rate)
        inside, tpot_s, on_time, *engine_mean = answer(rate, attempt)
        engine = SimpleNamespace(tpot=SimpleNamespace(mean=engine_mean[0])) if engine_mean else None
        return SimpleNamespace(
            slo_share=inside, trustworthy=on_time, reason=None, requests=10, errors=0,
            ttft_s=Percentiles(), tpot_s=Percentiles(p50=tpot_s), requests_per_s=rate,
            by_class=[], engine=engine,
        )  # fmt: skip

    monkeypatch.setattr(latency, "measure", measure)
    return tried


def test_capacity_searches_around_a_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    tried = fake_rates(monkeypatch, 6.2)  # the truth: 6.2 req/s, the prediction 5
    raw = {"ttft_slo_s": 1, "tpot_slo_s": 0.1, "share": 0.9, "predicted_rps": 5}
    params = parse_params("capacity", raw)
    assert isinstance(params, capacity.Params) and params.attempts() == 6
    out = asyncio.run(capacity.run(ProbeContext(None, "m"), params))  # type: ignore[arg-type]
    assert tried[:4] == [5, 5.5, 6.05, 6.655] and len(tried) <= 6
    assert out.capacity_rps is not None and out.first_failing_rps is not None
    assert 6.2 / 1.05 <= out.capacity_rps <= 6.2 < out.first_failing_rps


def test_capacity_measures_again_a_break_one_slow_window_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine holds up to 6.2 req/s, but its first window at 6.05 ran slow and broke it.
    Once the bracket closes on 6.05 the probe measures it again, finds it held, reports it
    as the capacity and says which rate it measured twice."""
    seen: list[float] = []

    def answer(rate: float, attempt: int) -> Answer:
        slow = rate == 6.05 and rate not in seen
        seen.append(rate)
        return (0.95 if rate <= 6.2 and not slow else 0.5), 0.004, True

    tried = fake_measure(monkeypatch, answer)
    raw = {"ttft_slo_s": 1, "tpot_slo_s": 0.1, "share": 0.9, "predicted_rps": 5}
    params = parse_params("capacity", raw)
    out = asyncio.run(capacity.run(ProbeContext(None, "m"), params))  # type: ignore[arg-type]
    assert tried == [5, 5.5, 6.05, 5.768, 6.05, 6.655]
    assert out.capacity_rps == pytest.approx(6.05) and out.first_failing_rps == pytest.approx(6.655)
    assert (
        "measured again where a window broke the bracket's edge: 6.05 req/s (broke, then "
        "held)" in out.message
    )
    # At max_rate too: the break there is measured again, and once it held the search stops.
    seen.clear()
    tried.clear()
    capped = parse_params("capacity", raw | {"max_rate": 6.05})
    out = asyncio.run(capacity.run(ProbeContext(None, "m"), capped))  # type: ignore[arg-type]
    assert tried == [5, 5.5, 6.05, 5.768, 6.05] and out.capacity_rps == pytest.approx(6.05)
    assert "held up to the highest rate tried, 6.05 req/s" in out.message


@pytest.mark.parametrize("case", ["slow", "late", "near"])
def test_capacity_re_aims_by_the_tpot_at_the_prediction(
    monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The engine runs at half the calibrated speed (TPOT 8 ms where 4 were predicted): the
    capacity is 5 req/s where the prediction said 10. The first rate's TPOT re-aims the
    search at 5; a first rate whose sender ran late does not (its timings are the client's);
    a TPOT that points within the next step leaves the search to step."""
    tpot = 0.0042 if case == "near" else 0.008  # near: points at 9.52, the step is to 9.09
    tried = fake_rates(monkeypatch, 5.0, tpot_s=tpot, late_first=case == "late")
    raw = {"ttft_slo_s": 1, "tpot_slo_s": 0.1, "predicted_rps": 10, "predicted_tpot_s": 0.004}
    params = parse_params("capacity", raw)
    out = asyncio.run(capacity.run(ProbeContext(None, "m"), params))  # type: ignore[arg-type]
    if case == "slow":
        assert tried[:2] == [10, 5.0] and out.steps[0].aim_rps == 5.0
        assert out.capacity_rps is not None and 5.0 / 1.05 <= out.capacity_rps <= 5.0
        assert "re-aimed the search at 5)" in out.message
    else:
        assert tried[:3] == [10, 9.091, 8.264] and out.capacity_rps is None
        assert "re-aimed" not in out.message
    if case == "late":
        assert out.steps[0].aim_rps is None and "pointed" not in out.message
    if case == "near":
        assert out.steps[0].aim_rps == 9.524 and "pointed at 9.524" in out.message
    with pytest.raises(InvalidInput, match="goes with predicted_rps"):
        parse_params("capacity", {"ttft_slo_s": 1, "tpot_slo_s": 0.1, "predicted_tpot_s": 0.004})


@pytest.mark.parametrize("late", [False, True])
def test_a_guided_search_predicts_and_re_aims_from_the_targets_calibration(
    monkeypatch: pytest.MonkeyPatch, late: bool
) -> None:
    """The engine is the calibrated simulator with every step 1.6 times as long (a machine
    gone slower since its calibration). Guided, the probe predicts from the stored
    calibration, measures there, finds the 1.6 from the TPOT it measured, jumps to where the
    slower engine's SLO holds, and lands within 5 % of it in at most six rates. When the
    first rate's sender ran late (the client's TPOT there is its own delay, here 40 %
    high), the engine's own TPOT mean re-aims it."""
    decodes, prefills = samples()
    fitted = fit(decodes, prefills, CALIBRATED)
    raw = {
        "ttft_slo_s": 1.0, "tpot_slo_s": 0.25, "share": 0.9, "guided": True,
        "prompt_tokens": 256, "output_tokens": 64, "arrival": "constant", "duration_s": 20,
    }  # fmt: skip
    params = parse_params("capacity", raw)
    assert isinstance(params, capacity.Params) and params.attempts() == 6
    ctx = ProbeContext(None, "m", calibration=fitted)  # type: ignore[arg-type]
    calibrated = params.scenario(fitted)
    engine = dataclasses.replace(calibrated, cost=calibrated.cost.scaled(1.6))
    truth = whatif.highest(engine)
    assert truth is not None

    def answer(rate: float, attempt: int) -> Answer:
        seen = whatif.predict(engine, rate)
        assert seen.tpot_s.p50 is not None and seen.tpot_s.mean is not None
        if late and attempt == 0:
            return 0.5, seen.tpot_s.p50 * 1.4, False, seen.tpot_s.mean
        return seen.slo_share, seen.tpot_s.p50, True, seen.tpot_s.mean

    tried = fake_measure(monkeypatch, answer)
    out = asyncio.run(capacity.run(ctx, params))
    predicted = whatif.highest(calibrated)
    assert predicted is not None and out.predicted_rps == round(predicted[0], 3)
    assert tried[0] == out.predicted_rps and len(tried) <= 6
    first = out.steps[0]
    assert first.aim_scale == pytest.approx(1.6, rel=0.03) and tried[1] == first.aim_rps
    assert first.aim_tpot == ("engine mean" if late else "client p50")
    assert out.capacity_rps is not None and abs(out.capacity_rps / truth[0] - 1) <= 0.05
    assert "steps run 1.6 times as long" in out.message
    assert ("its own mean" in out.message) == late
    assert "the calibrated simulator predicted" in out.message
    if late:
        return
    # Never past max_rate: from there, held, the search has its answer.
    tried.clear()
    capped = parse_params("capacity", raw | {"max_rate": 12})
    assert isinstance(capped, capacity.Params)
    out = asyncio.run(capacity.run(ctx, capped))
    assert tried == [12] and out.capacity_rps == 12 and out.first_failing_rps is None
    assert "held up to the highest rate tried, 12 req/s" in out.message
    with pytest.raises(InvalidInput, match="kvscope simulate calibrate --target NAME"):
        asyncio.run(capacity.run(ProbeContext(None, "m"), params))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="guided"):
        parse_params("capacity", raw | {"predicted_rps": 5})


def test_the_worker_guides_a_capacity_run_by_the_targets_stored_calibration(
    settings: Settings,
) -> None:
    """Through the worker: a guided run starts at the prediction from the calibration stored
    for its target (at most max_rate) and says so; on a target with none it fails, naming
    the command that makes one."""
    from probes.worker import Worker

    decodes, prefills = samples()
    fitted = fit(decodes, prefills, CALIBRATED)
    raw = {
        "ttft_slo_s": 1.0, "tpot_slo_s": 0.25, "share": 0.9, "guided": True, "max_rate": 30,
        "prompt_tokens": 16, "output_tokens": 4, "arrival": "constant", "duration_s": 0.5,
    }  # fmt: skip
    with serve(FakeConfig()) as fake:
        w = Worker(settings)
        calibrated = q.add_target(w.store, q.parse_target({"name": "c", "base_url": fake.url}))
        bare = q.add_target(w.store, q.parse_target({"name": "b", "base_url": fake.url}))
        save_calibration(w.store, "c", fitted)
        runs = [q.request_run(w.store, "capacity", raw, t.id) for t in (calibrated, bare)]
        end = time.monotonic() + 120
        while time.monotonic() < end and any(
            q.get_run(w.store, r.id).status in ("queued", "running") for r in runs
        ):
            w.work.pick_up()
            time.sleep(0.2)
        guided, refused = (q.get_run(w.store, r.id) for r in runs)
    assert guided.status == "done", guided.error
    found = whatif.highest(capacity.Params.model_validate(raw).scenario(fitted))
    assert found is not None and guided.summary["predicted_rps"] == round(found[0], 3)
    first = min(found[0], 30)  # the prediction, within max_rate
    assert guided.summary["steps"][0]["rate"] == pytest.approx(first, abs=1e-3)
    assert all(step["rate"] <= 30 for step in guided.summary["steps"])
    assert "the calibrated simulator predicted" in guided.summary["message"]
    assert refused.status == "failed"
    assert "kvscope simulate calibrate --target NAME" in (refused.error or "")


def test_sweep_runs_every_step() -> None:
    params = parse_params(
        "batch_sweep",
        {
            "concurrencies": [1, 2, 4],
            "requests_per_step": 8,
            "prompt_tokens": 16,
            "output_tokens": 8,
        },
    )
    # Slow enough tokens that the client's own overhead (a busy machine's) stays small.
    with serve(FakeConfig(itl_s=0.02)) as fake:
        out = _run("batch_sweep", params, fake.url)
    assert [s.concurrency for s in out.steps] == [1, 2, 4]
    assert all(s.ok == 8 and s.output_tokens_per_s > 0 for s in out.steps)
    # The stand-in streams in parallel without limit: throughput keeps rising, no knee.
    assert out.knee.concurrency is None


def test_oom_finds_the_context_limit_and_needs_consent() -> None:
    with pytest.raises(InvalidInput, match=r"confirm to run it \(--confirm from a shell\)"):
        parse_params("oom", {})
    params = parse_params(
        "oom", {"confirm": True, "batch": 2, "start_context": 512, "step": 512, "output_tokens": 8}
    )
    with serve(FakeConfig(max_model_len=2048, metrics=True, itl_s=0.05)) as fake:
        with pytest.raises(InvalidInput, match="with allow_external set"):
            _run("oom", params, fake.url)
        out = _run("oom", params, fake.url, managed=True)
    assert [s.context for s in out.steps] == [512, 1024, 1536, 2048, 2560]
    assert all(s.together and s.tries == 1 for s in out.steps[:-1])
    assert out.last_good_context == 2048
    assert out.failure.kind == "rejected_too_long" and out.failure.context == 2560
    assert out.health_after == "healthy"


def test_kv_usage_timeline_and_verdict() -> None:
    params = parse_params(
        "kv_usage",
        {
            "rate": 10,
            "duration_s": 2,
            "baseline_s": 0.5,
            "cooldown_s": 1.5,
            "sample_every_s": 0.2,
            "prompt_tokens": 32,
            "prefix_tokens": 16,
            "output_tokens": 4,
        },
    )
    with serve(FakeConfig(metrics=True)) as fake:
        out = _run("kv_usage", params, fake.url)
    assert out.requests == 20 and out.unique_prefixes == 5
    assert len(out.timeline) >= 10
    assert all(p.kv_usage is not None for p in out.timeline)  # sampled every time
    assert out.slope_per_min == 0 and out.returned_to_baseline is True


def test_an_open_sweep_stops_once_past_the_knee() -> None:
    rising = [_step(1, 100, 1.0), _step(2, 200, 1.0), _step(4, 400, 1.0)]
    assert not past_knee(rising, 2)
    falling = [*rising, _step(8, 410, 2.0), _step(16, 415, 4.0)]
    assert past_knee(falling, 2)
    assert not past_knee(falling[:-1], 2)  # one fall may be noise


def _ttft_scrape(le_01: float, total: float) -> Any:
    from probes.vllm.metrics import parse_metrics

    return parse_metrics(
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="m"}} {le_01}\n'
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {total}\n'
        f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {total}\n'
        f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total * 0.05}\n'
    )


def test_engine_histogram_delta_between_scrapes_survives_a_restart() -> None:
    from probes.kinds.context import histogram_delta

    grew = histogram_delta(_ttft_scrape(10, 10), _ttft_scrape(18, 20), "ttft")
    assert grew.count == 10  # 8 fast, 2 slow in between
    assert grew.p50 is not None and grew.p50 <= 0.1
    # The engine restarted in between: its counts since the restart, never negative ones.
    restarted = histogram_delta(_ttft_scrape(10, 10), _ttft_scrape(3, 4), "ttft")
    assert restarted.count == 4


def test_an_oom_step_counts_its_preemptions_when_samples_go_unanswered() -> None:
    """Beside a CPU hog, a saturated engine's /metrics answers later than a sample waits:
    a step's verdict reads the counter between steps, patiently, so preemptions the samples
    missed still fail the step (a context the cache could not hold once passed as ok)."""
    params = parse_params(
        "oom",
        {"confirm": True, "batch": 2, "start_context": 512, "step": 512, "output_tokens": 8,
         "max_context": 512},
    )  # fmt: skip
    slow = FakeConfig(metrics=True, metrics_delay_s=2.5, preempt_over_tokens=256)
    with serve(slow) as fake:
        out = _run("oom", params, fake.url, managed=True)
    (step,) = out.steps
    assert (step.preemptions, step.preemptions_counted) == (2, "between steps")
    assert out.failure.kind == "kv_exhausted" and out.failure.context == 512
