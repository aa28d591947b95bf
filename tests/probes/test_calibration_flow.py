"""The calibration's flow (`kvscope simulate calibrate`, the benchmarks): its measurements
taken through one probe runner, the cost of an arrival read from a run past the knee, a
tuning run that queued made again at half the rate, a retune that makes the tuning run alone
again, and an engine that cannot be calibrated refused with every reason."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine

from planner.errors import InvalidInput, TargetError
from planner.simulate import SimRequest, simulate
from planner.simulate.calibrate import (
    CALIBRATION_KEY,
    LOAD_PARAMS,
    LOAD_TRIES,
    MAX_CHECKS,
    NOISE_CHECKS,
    SATURATED_PARAMS,
    SHAPE_PARAMS,
    SWEEP_CONTEXT,
    UNSTEADY_SPAN,
    Check,
    Sweep,
    load_rate,
    retune_hint,
    saturated_rate,
    speed_span,
)
from planner.simulate.calibrate import checked as checked_with
from planner.simulate.engine import HostSpeed
from planner.simulate.steps import Steps
from planner.simulate.whatif import Scenario, capacity_rps, traffic
from planner.workload import Arrival, FixedProfile, parse_profile
from probes.kinds import calibration
from storage import queries as q
from storage.db import transaction
from storage.tables import RequestRecord
from tests.planner.test_calibrate import (
    API_S,
    CONFIG,
    TRUE,
    busy_steps,
    closed_loop_tpot,
    lone_ttft,
)

PROFILE = FixedProfile(prompt_tokens=SWEEP_CONTEXT[0], output_tokens=SWEEP_CONTEXT[1])


class FakeEngine:
    """Answers the calibration's probes as the simulator with the true step cost would, and
    stores their requests; its tuning runs report a standing queue `queued` times. Each
    arrival takes `arrival_s` of its steps' time, under open-loop load a sequence costs a
    step `seq_extra` more than quiet, and a step with a token count never run `shape_s`
    more, one evicted from the 32 kept `replan_s`; the runs past the knee's drains run
    `drain_slow` times as long a step (a shared host; one for each such run, the last for
    any after), and the tuning runs their 5-s windows `tune_speed` times (one tuple for
    each such run, the last for any after)."""

    def __init__(
        self,
        store: Engine,
        queued: int = 0,
        bursts: bool = False,
        arrival_s: float = 0.0,
        seq_extra: float = 0.0,
        shape_s: float = 0.0,
        replan_s: float = 0.0,
        drain_slow: float | tuple[float, ...] = 1.0,
        tune_speed: tuple[tuple[float, ...], ...] = ((1.0,),),
    ) -> None:
        self.store, self.queued, self.bursts, self.arrival_s = store, queued, bursts, arrival_s
        self.drain_slow = drain_slow if isinstance(drain_slow, tuple) else (drain_slow,)
        self.seq_extra, self.shape_s, self.replan_s = seq_extra, shape_s, replan_s
        self.tune_speed = tune_speed
        self.slow = 1.0  # how much longer than TRUE its steps take under open-loop load
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.said: list[str] = []

    def run(self, kind: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.calls.append((kind, params))
        run = q.request_run(self.store, kind, params)
        if kind == "batch_sweep":
            return run.id, self.sweep()
        if "rate" in params and params["profile"]["kind"] == "fixed":
            return run.id, self.load(run.id, params)
        if params == SHAPE_PARAMS:  # (lone prompts of many lengths, in order)
            rate = float(params["rate"])
            n = int(rate * params["duration_s"])
            shapes = parse_profile(params["profile"]).shapes(n, params["seed"])
            lone = [
                SimRequest(i / rate, s.prompt_tokens, s.output_tokens) for i, s in enumerate(shapes)
            ]
            self.store_requests(run.id, lone)
            return run.id, {}
        pairs = params["profile"]["pairs"]
        lone = [SimRequest(8.0 * i, prompt, out) for i, (prompt, out) in enumerate(pairs * 2)]
        self.store_requests(run.id, lone)
        return run.id, {}

    def sweep(self) -> dict[str, Any]:
        prompt, output = SWEEP_CONTEXT
        ttft = API_S + lone_ttft(prompt)
        steps = []
        for c in (1, 2, 4, 8):
            tpot = closed_loop_tpot(c)
            e2e = ttft + (output - 1) * tpot
            # Beside a CPU hog the answers came whole: TPOT a sliver of their spread.
            shown = tpot / 100 if self.bursts else tpot
            steps.append({"concurrency": c, "tpot_s": {"p50": shown}, "ttft_s": {"p50": ttft},
                          "e2e_s": {"p50": e2e}, "requests_per_s": c / e2e})  # fmt: skip
        return {"steps": steps}

    def load(self, run_id: int, params: dict[str, Any]) -> dict[str, Any]:
        rate = float(params["rate"])
        profile = FixedProfile(prompt_tokens=SWEEP_CONTEXT[0], output_tokens=SWEEP_CONTEXT[1])
        n = int(rate * params["duration_s"])
        arrivals = list(traffic(profile, Arrival(rate=rate), n))
        last = int(params["duration_s"] // 5)  # (the host's 5 s windows up to the last send)
        slow = self.drain_of(len(self.saturated()) - 1)
        drain = HostSpeed(5.0, (1.0,) * last + (slow,) * 4 * last)
        speed = drain if self.past_knee(params) and slow != 1 else None
        if not self.past_knee(params):
            windows = self.tune_speed[min(len(self.rates()), len(self.tune_speed)) - 1]
            speed = HostSpeed(5.0, windows)
        ttft, tpot = self.store_requests(run_id, arrivals, self.slow, self.seq_extra, speed)
        queued = not self.past_knee(params) and len(self.rates()) <= self.queued
        queue_s = 2 * ttft if queued else 0.0
        return {"ttft_s": {"p50": ttft + queue_s}, "tpot_s": tpot,
                "engine": {"queue_time": {"mean": queue_s}}}  # fmt: skip

    def store_requests(
        self,
        run_id: int,
        requests: list[SimRequest],
        slow: float = 1.0,
        seq_extra: float = 0.0,
        speed: HostSpeed | None = None,
    ) -> tuple[float, dict[str, float]]:
        """Store what the simulator with the true cost (`slow` times it, a sequence
        `seq_extra` more) says of `requests`; their TTFT median and TPOT median and mean."""
        cost = dataclasses.replace(
            TRUE, overhead_s=TRUE.overhead_s * slow, token_compute_s=TRUE.token_compute_s * slow,
            seq_s=(TRUE.seq_s + seq_extra) * slow, pair_s=TRUE.pair_s * slow,
            arrival_s=self.arrival_s, shape_s=self.shape_s, replan_s=self.replan_s,
        )  # fmt: skip
        results = list(simulate(requests, CONFIG, cost, speed=speed))
        with transaction(self.store) as s:
            for seq, r in enumerate(results):
                assert r.ttft_s is not None and r.e2e_s is not None
                at = 1000.0 + r.request.arrival_s
                s.add(
                    RequestRecord(
                        run_id=run_id, seq=seq, scheduled_ts=at, sent_ts=at,
                        first_token_ts=at + API_S + r.ttft_s, end_ts=at + API_S + r.e2e_s,
                        prompt_tokens=r.request.prompt_tokens,
                        output_tokens=r.request.output_tokens, status="ok",
                    )
                )  # fmt: skip
        ttfts = [API_S + r.ttft_s for r in results if r.ttft_s is not None]
        tpots = [r.tpot_s for r in results if r.tpot_s is not None] or [0.0]
        return float(np.median(ttfts)), {
            "p50": float(np.median(tpots)),
            "mean": float(np.mean(tpots)),
        }

    def rates(self) -> list[float]:
        """The tuning runs' rates."""
        return [float(p["rate"]) for p in self.open_loop() if not self.past_knee(p)]

    def saturated(self) -> list[float]:
        """The rates of the runs past the knee."""
        return [float(p["rate"]) for p in self.open_loop() if self.past_knee(p)]

    def open_loop(self) -> list[dict[str, Any]]:
        return [p for _, p in self.calls if p.get("profile", {}).get("kind") == "fixed"]

    def drain_of(self, past_knee: int) -> float:
        """How much longer than the rest the drain of the run past the knee `past_knee`
        (counting from 0) runs its steps."""
        return self.drain_slow[min(past_knee, len(self.drain_slow) - 1)]

    @staticmethod
    def past_knee(params: dict[str, Any]) -> bool:
        return bool(params["duration_s"] == SATURATED_PARAMS["duration_s"])


def test_a_tuning_run_that_queued_is_made_again_at_half_the_rate(store: Engine) -> None:
    engine = FakeEngine(store, queued=2)
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    first = engine.rates()[0]
    quiet = cal.model_copy(update={"load_scale": 1.0, "load_api_s": 0.0})
    assert first == load_rate(
        quiet, Sweep.model_validate(engine.sweep())
    )  # what the quiet fit and the sweep allow
    assert engine.rates() == [first, round(first / 2, 2), round(round(first / 2, 2) / 2, 2)]
    # Each try with prompts of its own: the last try's again would meet the prefix cache.
    seeds = [p["seed"] for p in engine.open_loop() if not engine.past_knee(p)]
    assert seeds == [LOAD_PARAMS["seed"] + i for i in range(3)]
    again = [s for s in engine.said if "again at half the rate" in s]
    assert len(again) == 2 and f"at {first:g} req/s it queued" in again[0]
    # Tuned on the third run, which did not queue: the true cost, nothing added by load.
    assert cal.tuned_rate == engine.rates()[-1]
    assert cal.load_scale == pytest.approx(1.0, abs=0.1)
    assert cal.request_s == pytest.approx(API_S, abs=0.003)


def test_a_tuning_run_on_an_unsteady_host_is_made_again_and_the_steadier_kept(
    store: Engine,
) -> None:
    """BD and BQ-BT were tuned on runs whose host ran its 5-s windows 1.37-2.21 apart and
    met 0-6 of 21 figures: a tune on a disturbed host fits the disturbance. Such a run is
    made once more at its rate with prompts of its own, and the steadier run is kept."""
    disturbed = (1.0, 1.0, 1.8, 1.0, 0.8, 1.0)
    engine = FakeEngine(store, tune_speed=(disturbed, (1.0,)))
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    tuning = [p for p in engine.open_loop() if not engine.past_knee(p)]
    seed = LOAD_PARAMS["seed"]
    assert [p["seed"] for p in tuning] == [seed, seed + LOAD_TRIES]
    assert tuning[0]["rate"] == tuning[1]["rate"] == cal.tuned_rate
    said = " ".join(engine.said)
    assert "the tuning run's host ran x0." in said and "the run to tune on made again" in said
    assert "the second kept" in said
    assert speed_span(cal) < 1.05 and cal.load_scale == pytest.approx(1.0, abs=0.03)
    # Both disturbed: the one that spread less is kept, and the hint still calls for a new
    # calibration.
    worse = FakeEngine(store, tune_speed=(disturbed, (1.0, 2.2, 1.0, 0.7, 1.0, 1.0)))
    kept = calibration.calibrate(store, worse.run, CONFIG, worse.said.append)
    made_again = re.search(r"the run made again ran its windows x([0-9.]+) apart; the first kept",
                           " ".join(worse.said))  # fmt: skip
    assert made_again is not None
    assert UNSTEADY_SPAN < speed_span(kept) < float(made_again[1])
    hint = retune_hint(kept, time.time())
    assert hint is not None and hint.startswith("the tuning run's host ran")
    # A retune on a disturbed host likewise, with prompts new to both runs.
    engine.calls.clear()
    again = calibration.retune(store, engine.run, cal, CONFIG, engine.said.append, seed=100)
    assert [p["seed"] for _, p in engine.calls] == [100, 100 + LOAD_TRIES]
    assert speed_span(again) < 1.05


def test_an_unsteady_tuning_run_whose_second_run_queued_is_kept(store: Engine) -> None:
    """The run made again is refused as any tuning run is (it queued): the first is kept,
    and said so."""
    engine = FakeEngine(store, tune_speed=((1.0, 1.0, 1.8, 1.0, 0.8, 1.0), (1.0,)))

    def run(kind: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        run_id, summary = engine.run(kind, params)
        if params.get("seed") == LOAD_PARAMS["seed"] + LOAD_TRIES:  # (the run made again)
            summary = dict(summary, engine={"queue_time": {"mean": 10.0}})
        return run_id, summary

    cal = calibration.calibrate(store, run, CONFIG, engine.said.append)
    said = " ".join(engine.said)
    assert "the run made again queued: 10,000 ms in the engine's queue" in said
    assert "; the first kept" in said and speed_span(cal) > UNSTEADY_SPAN


def test_a_new_calibration_on_a_slower_host_says_so_against_the_previous_one(
    store: Engine,
) -> None:
    """BW: a whole calibration in a slow spell shows nothing unsteady in itself; set beside
    the target's previous calibration of the same engine, it says the host ran slower. A
    calibration stored in a form no longer read is replaced, not compared."""
    key = CALIBRATION_KEY.format("cpu")
    q.put_state(store, key, {"overhead": "a form no longer read"})
    engine = FakeEngine(store)
    first = calibration.calibrate_anew(store, engine.run, CONFIG, "cpu", engine.said.append)
    assert first.target == "cpu" and first.fitted_at == first.tuned_at is not None
    assert not [s for s in engine.said if "the previous one" in s]
    q.put_state(store, key, first.model_dump(mode="json"))
    again = calibration.calibrate_anew(store, engine.run, CONFIG, "cpu", engine.said.append)
    assert not [s for s in engine.said if "the previous one" in s]  # (the same host)
    engine.slow = 2.0  # every step under load twice as long, from now on
    calibration.calibrate_anew(store, engine.run, CONFIG, "cpu", engine.said.append)
    moved = [s for s in engine.said if "the previous one" in s]
    assert len(moved) == 1 and "the host ran slower while this one measured" in moved[0]
    assert again.load_scale == pytest.approx(first.load_scale, rel=0.05)


def test_an_engine_that_queues_at_every_rate_is_refused_with_each_reason(store: Engine) -> None:
    engine = FakeEngine(store, queued=LOAD_TRIES)
    with pytest.raises(TargetError, match="could not be tuned") as refused:
        calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    assert len(engine.rates()) == LOAD_TRIES
    for rate in engine.rates():
        assert f"at {rate:g} req/s it queued" in str(refused.value)
    assert "fewer other processes" in str(refused.value)


def test_a_sweep_that_came_in_bursts_stops_the_calibration_first(store: Engine) -> None:
    engine = FakeEngine(store, bursts=True)
    with pytest.raises(TargetError, match="bursts"):
        calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    assert [kind for kind, _ in engine.calls] == ["batch_sweep"]


def test_a_retune_makes_only_the_open_loop_run_again_and_finds_the_slower_host(
    store: Engine,
) -> None:
    engine = FakeEngine(store)
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    assert cal.load_scale == pytest.approx(1.0, abs=0.1)
    engine.calls.clear()
    engine.slow = 1.6  # the machine got slower under load since
    again = calibration.retune(store, engine.run, cal, CONFIG, engine.said.append)
    # One run, the tuning run at the rate it was tuned at: no sweep, no lone requests.
    assert [(kind, p.get("rate")) for kind, p in engine.calls] == [("latency", cal.tuned_rate)]
    assert engine.calls[0][1]["seed"] != LOAD_PARAMS["seed"]  # new prompts, not the cached
    assert again.load_scale == pytest.approx(1.6, rel=0.1)
    kept = ("overhead_s", "token_s", "seq_s", "pair_s", "api_s", "residual_low", "samples",
            "arrival_s", "saturated_rate", "load_seq_s", "queued_tpot", "shape_s")  # fmt: skip
    assert {k: getattr(again, k) for k in kept} == {k: getattr(cal, k) for k in kept}
    assert again.tuned_rate == cal.tuned_rate and again.engine == cal.engine
    # What the stored calibration missed by is kept as a check: its steps ran 1.6 times
    # as long in the new run.
    assert not cal.checks and [c.run for c in again.checks] == ["retune"]
    assert again.checks[0].drift == pytest.approx(1.6, rel=0.1) and again.checks[0].queued is False
    # With the host's noise of its run at that drift (this engine has none).
    noise = np.array(again.checks[0].noise)
    assert len(noise) >= 30 and np.abs(np.median(noise, axis=0)).max() < 0.003
    # Tuned after that check: the checks since the tune, which a prediction takes its
    # scale from, are the new cost's. Three runs that found the old cost 1.6 times short
    # would otherwise scale the new one, which already has it, by 1.6 again.
    assert again.tuned_at is not None and again.tuned_at >= again.checks[0].at
    slow = [Check(at=time.time() - 30 + i, drift=1.6, run=f"latency run {i}") for i in range(3)]
    drifted = cal.model_copy(update={"checks": slow, "tuned_at": time.time() - 60})
    assert drifted.checked_scale() == pytest.approx(1.6)
    retuned = calibration.retune(store, engine.run, drifted, CONFIG, engine.said.append)
    assert not retuned.checks_since_tune() and retuned.checked_scale() == 1.0


def test_a_later_latency_run_is_checked_against_the_calibration_once(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine(store)
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    cal = cal.model_copy(update={"tuned_at": time.time() - 60})
    engine.slow = 1.3
    run_id, summary = engine.run("latency", dict(LOAD_PARAMS, rate=cal.tuned_rate, seed=77))
    q.update_run(store, run_id, status="done", summary=summary)
    checked = calibration.check(store, cal, run_id, CONFIG)
    assert [c.run for c in checked.checks] == [f"latency run {run_id}"]
    assert checked.checks[0].drift == pytest.approx(1.3, rel=0.05)
    assert checked.checks[0].queued is False
    assert "1 later run replayed at this cost ran its steps x1.3" in checked.describe()
    assert "the host's noise from 1 that did not queue" in checked.describe()
    assert len(checked.checks[0].noise) >= 30
    # A run that queued keeps its drift and not its residuals, which are the queue's too.
    waited_id, waited = engine.run("latency", dict(LOAD_PARAMS, rate=cal.tuned_rate, seed=78))
    waited["engine"] = {"queue_time": {"mean": 2 * waited["ttft_s"]["p50"]}}
    q.update_run(store, waited_id, status="done", summary=waited)
    both = calibration.check(store, checked, waited_id, CONFIG)
    assert both.checks[-1].drift == pytest.approx(1.3, rel=0.05) and both.checks[-1].noise == []
    assert both.checks[-1].queued is True  # (its batches full: the full batch's cost it reads)
    assert "the host's noise from 1 that did not queue" in both.describe()
    with pytest.raises(InvalidInput, match=f"run {run_id} was checked already"):
        calibration.check(store, checked, run_id, CONFIG)
    later = cal.model_copy(update={"tuned_at": time.time() + 60})
    with pytest.raises(InvalidInput, match="started before the calibration was tuned"):
        calibration.check(store, later, run_id, CONFIG)
    queued = q.request_run(store, "latency", dict(LOAD_PARAMS, rate=1.0)).id
    with pytest.raises(InvalidInput, match=f"run {queued} is a queued latency run"):
        calibration.check(store, cal, queued, CONFIG)
    # Kept with the calibration as stored; a calibration written while a check ran (here a
    # retune landing during the first) is never overwritten: the check is made on it, the
    # run's requests read once.
    target = q.add_target(store, q.parse_target({"name": "cpu", "base_url": "http://127.0.0.1:1"}))
    key = CALIBRATION_KEY.format("cpu")
    q.put_state(store, key, cal.model_dump(mode="json"))
    retuned = cal.model_copy(update={"load_scale": cal.load_scale * 1.3})
    made_on: list[float] = []
    reads: list[int] = []
    plain, read = calibration._checked, calibration._replayed

    def landing(on: Any, run: Any, engine: Any, now: Any) -> Any:
        made_on.append(on.load_scale)
        if len(made_on) == 1:  # (a retune lands while the first check runs)
            time.sleep(0.01)
            q.put_state(store, key, retuned.model_dump(mode="json"))
        return plain(on, run, engine, now)

    def counted(store: Engine, run: int) -> Any:
        reads.append(run)
        return read(store, run)

    monkeypatch.setattr(calibration, "_checked", landing)
    monkeypatch.setattr(calibration, "_replayed", counted)
    kept = calibration.keep_check(store, target, run_id, Path("."))
    assert made_on == [cal.load_scale, retuned.load_scale] and reads == [run_id]
    stored = calibration.stored(store, "cpu")
    assert stored == kept and stored.load_scale == retuned.load_scale
    assert stored.checks[-1].drift == pytest.approx(1.0, rel=0.05)  # (the retune's scale)
    # The newest MAX_CHECKS are kept, the host noise of the newest NOISE_CHECKS that have
    # it (here every third run queued and has none).
    many = cal
    for i in range(MAX_CHECKS + 3):
        noise = [] if i % 3 == 0 else [(0.001, 0.002)]
        made = Check(at=float(i), drift=1.0 + i / 100, run=f"run {i}", noise=noise)
        many = checked_with(many, made)
    assert len(many.checks) == MAX_CHECKS and many.checks[-1].run == f"run {MAX_CHECKS + 2}"
    assert [c.drift for c in many.checks] == [1.0 + i / 100 for i in range(3, MAX_CHECKS + 3)]
    noisy = [int(c.run.split()[1]) for c in many.checks if c.noise]
    assert noisy == [i for i in range(MAX_CHECKS + 3) if i % 3][-NOISE_CHECKS:]


@pytest.mark.parametrize(("arrival_s", "seq_extra"), [(0.0, 0.0), (0.002, 0.0), (0.005, 3e-4)])
def test_a_run_past_the_knee_prices_each_arrival_and_the_full_batch(
    store: Engine, arrival_s: float, seq_extra: float
) -> None:
    """The first open-loop run is past the knee, with prompts of its own; the engine time
    each arriving request takes is read from it and the tune replays with it, so that the tune
    still finds the engine's own steps; its drain gives a full batch's cost a sequence
    (more under load than quiet), and predictions past the knee serve what the engine
    serves."""
    engine = FakeEngine(store, arrival_s=arrival_s, seq_extra=seq_extra)
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    quiet = cal.model_copy(
        update={"load_scale": 1.0, "load_api_s": 0.0, "arrival_s": 0.0, "load_seq_s": 0.0}
    )
    sweep = Sweep.model_validate(engine.sweep())
    assert engine.saturated() == [saturated_rate(quiet, sweep)]
    assert engine.open_loop()[0] == dict(SATURATED_PARAMS, rate=engine.saturated()[0])
    assert engine.saturated()[0] > load_rate(quiet, sweep) * 3  # (well past the knee)
    assert cal.saturated_rate == engine.saturated()[0]
    assert cal.arrival_s == pytest.approx(arrival_s, abs=0.0005)
    assert cal.load_seq_s == pytest.approx(seq_extra, abs=5e-5)
    assert cal.load_scale == pytest.approx(1.0, abs=0.05)
    assert (
        f"each request arriving while a batch runs takes {cal.arrival_s * 1000:.2f} ms"
        in cal.describe()
    )
    # The run past the knee's TPOTs as the calibrated replay has them (this engine's steps
    # are the simulator's): a spread about 1, its mean 1.
    assert len(cal.queued_tpot) >= 30 and np.mean(cal.queued_tpot) == pytest.approx(1, abs=0.01)
    assert max(abs(k - 1) for k in cal.queued_tpot) < 0.1
    shapes, said = engine.said
    assert "a step with a token count never run takes 0.00 ms more" in shapes
    assert "in the drain" in said and f"takes {cal.arrival_s * 1000:.2f} ms" in said
    # Past the knee, at 1.2 times what the engine serves.
    truth = dataclasses.replace(TRUE, arrival_s=arrival_s, seq_s=TRUE.seq_s + seq_extra)
    rate = 1.2 * capacity_rps(Scenario(CONFIG, truth, PROFILE, 400))
    stream = list(traffic(PROFILE, Arrival(rate=rate), 400, seed=9))
    ends = [max(r.e2e_s or 0.0 for r in simulate(stream, CONFIG, c)) for c in (truth, cal.cost())]
    assert ends[1] == pytest.approx(ends[0], rel=0.05)


def test_a_drain_on_a_slower_host_is_taken_at_the_arrivals_speed(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run past the knee's drain ran on a host a quarter slower: its steps, on the clock
    its requests were sent by, say so, and the arrival is priced as the engine took it (its
    drain alone says 0). A drain slower than its arrivals is a slow spell of the host, so
    the run is made again; the drain of the run made again is as slow, and the first is
    kept. The fake engine's answers carry
    no token times, so its steps are made here, the drain's as slow as its requests'."""
    engine = FakeEngine(store, arrival_s=0.002, drain_slow=1.25)
    read = calibration.steps_of
    monkeypatch.setattr(calibration, "steps_of", made_steps(engine, read))
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    assert cal.arrival_s == pytest.approx(0.002, abs=0.0005)
    assert [p["seed"] for p in engine.open_loop() if engine.past_knee(p)] == [23, 24]
    moved, again, said = engine.said[1:4]
    assert (
        "; its drain ran slower than its arrivals (a slow spell of the host): made again" in moved
    )
    assert again.startswith("made again it ") and again.endswith("; the first kept")
    assert said.startswith("the run past the knee at ") and ", the drain's taken x0.8" in said
    assert "; a full batch's steps with nothing sent near them took " in said
    assert f"takes {cal.arrival_s * 1000:.2f} ms of the engine's steps" in said
    monkeypatch.setattr(calibration, "steps_of", read)  # (no steps: the drain as it ran)
    plain = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    assert plain.arrival_s < 0.0005
    said = [x for x in engine.said if x.startswith("the run past the knee at ")][-1]
    assert "; its answers show no step of a full batch (the drain taken as it ran);" in said


def test_a_run_past_the_knee_the_host_moved_within_is_made_again_and_the_steadier_kept(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BM and BQ: the drain ran in a slow spell, and a full batch's cost, fitted on the
    drain as it ran, read a sequence +156 to +204 us a step. Made again on a steady host,
    the full batch costs what it does."""
    engine = FakeEngine(store, seq_extra=2e-4, drain_slow=(1.25, 1.0))
    monkeypatch.setattr(calibration, "steps_of", made_steps(engine, calibration.steps_of))
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    assert [p["seed"] for p in engine.open_loop() if engine.past_knee(p)] == [23, 24]
    assert "a slow spell of the host" in engine.said[1]
    assert "the first kept" not in " ".join(engine.said)
    assert cal.load_seq_s == pytest.approx(2e-4, abs=5e-5)
    # A drain faster than its arrivals is what the load generator's own work leaves: kept.
    fast = FakeEngine(store, seq_extra=2e-4, drain_slow=0.8)
    monkeypatch.setattr(calibration, "steps_of", made_steps(fast, calibration.steps_of))
    calibration.calibrate(store, fast.run, CONFIG, fast.said.append)
    assert [p["seed"] for p in fast.open_loop() if fast.past_knee(p)] == [23]
    # Kept as it ran, the slow drain's full batch would cost far more a sequence.
    slow = FakeEngine(store, seq_extra=2e-4, drain_slow=1.25)
    monkeypatch.setattr(calibration, "UNSTEADY_DRAIN", 1.0)  # (never made again)
    kept = calibration.calibrate(store, slow.run, CONFIG, slow.said.append)
    assert [p["seed"] for p in slow.open_loop() if slow.past_knee(p)] == [23]
    assert kept.load_seq_s > cal.load_seq_s + 2e-4


def made_steps(engine: FakeEngine, read: Callable[[Engine, int], Steps]) -> Any:
    """`steps_of` for the fake engine's runs past the knee, whose answers carry no token
    times: a full batch's steps back to back, each drain as slow as its requests'."""

    def steps_of(store: Engine, run_id: int) -> Steps:
        params = q.get_run(store, run_id).params
        if not engine.past_knee(params):
            return read(store, run_id)
        nth = [p["seed"] for p in engine.open_loop() if engine.past_knee(p)].index(params["seed"])
        sends = [row[0] for row in q.replayable(store, run_id)]
        return Steps(busy_steps(sends, engine.arrival_s, drain=engine.drain_of(nth)), 0, 0.003)

    return steps_of


def test_a_run_past_the_knee_that_fails_leaves_arrivals_unpriced_and_says_why(
    store: Engine,
) -> None:
    engine = FakeEngine(store, arrival_s=0.002)
    measure = engine.run

    def failing(kind: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if params.get("seed") == SATURATED_PARAMS["seed"]:
            raise TargetError("the engine at http://127.0.0.1:9 stopped answering")
        return measure(kind, params)

    cal = calibration.calibrate(store, failing, CONFIG, engine.said.append)
    assert cal.tuned_rate is not None and cal.load_scale > 1  # (the arrivals in the steps)
    assert (cal.arrival_s, cal.saturated_rate) == (0.0, None)
    assert cal.queued_tpot == []
    said = engine.said[-1]
    assert said.startswith("the run past the knee at ") and said.endswith(
        " req/s failed: the engine at http://127.0.0.1:9 stopped answering; the calibration "
        "leaves arrivals without a cost"
    )
    assert "arriving while a batch runs" not in cal.describe()


def test_a_retune_of_a_changed_engine_is_refused_naming_what_changed(store: Engine) -> None:
    engine = FakeEngine(store)
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    engine.calls.clear()
    other = dataclasses.replace(CONFIG, max_num_seqs=16)
    with pytest.raises(InvalidInput, match=r"max_num_seqs 16 \(fitted on 8\)"):
        calibration.retune(store, engine.run, cal, other, engine.said.append)
    assert engine.calls == []  # refused before anything ran


@pytest.mark.parametrize(("shape_s", "replan_s"), [(0.0, 0.0), (0.0025, 0.0004)])
def test_lone_prompts_of_many_lengths_in_order_price_each_kind_of_token_count(
    store: Engine, shape_s: float, replan_s: float
) -> None:
    """After the quiet fit, lone prompts of many lengths in order: those whose token count
    the engine never ran took `shape_s` longer, those it had evicted from its 32 plans
    `replan_s`, and the calibration finds both (0 where planning is free); what was
    measured and what follows from it are said."""
    engine = FakeEngine(store, shape_s=shape_s, replan_s=replan_s)
    cal = calibration.calibrate(store, engine.run, CONFIG, engine.said.append)
    assert [kind for kind, _ in engine.calls][:3] == ["batch_sweep", "latency", "latency"]
    assert engine.calls[2][1] == SHAPE_PARAMS
    assert (cal.shape_s, cal.replan_s) == pytest.approx((shape_s, replan_s), abs=1e-4)
    cost = cal.cost()
    assert (cost.shape_s, cost.replan_s) == pytest.approx(
        (shape_s * cal.load_scale, replan_s * cal.load_scale), abs=1e-4
    )
    said = engine.said[0]
    assert "lone prompts whose token count was never run" in said
    assert said.endswith(
        f"a step with a token count never run takes {cal.shape_s * 1000:.2f} ms more, one run "
        f"before but not among the last 32 {cal.replan_s * 1000:.2f} ms"
    )
    assert ("never run takes" in cal.describe()) == bool(shape_s)


def test_a_run_of_lone_prompts_that_fails_leaves_new_token_counts_unpriced(store: Engine) -> None:
    engine = FakeEngine(store, shape_s=0.0025)
    measure = engine.run

    def failing(kind: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if params == SHAPE_PARAMS:
            raise TargetError("the engine at http://127.0.0.1:9 stopped answering")
        return measure(kind, params)

    cal = calibration.calibrate(store, failing, CONFIG, engine.said.append)
    assert cal.shape_s == 0.0 and cal.tuned_rate is not None
    assert engine.said[0] == (
        "the run of lone prompts of many lengths failed: the engine at http://127.0.0.1:9 "
        "stopped answering; the calibration leaves new token counts without a cost"
    )
