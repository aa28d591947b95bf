"""A calibration's measurements, in one place for `kvscope simulate calibrate` and the
benchmarks: a batch sweep and lone requests of three prompt lengths (the quiet fit), then
lone prompts of many lengths in order for what a step takes to plan its matmuls for a token
count never run and for one evicted (`planner.simulate.calibrate.shape_cost`), then a
short open-loop run past the knee for the engine time each arriving request takes
(`planner.simulate.calibrate.arrival_cost`, its drain taken at the host's speed while
requests arrived, `host_drift`, from its steps read back from its token times), then an
open-loop run at a share of the quiet fit's capacity (the tune, with that arrival cost in
its replays), made again at half the rate while it queued
(`planner.simulate.calibrate.tuning_refused`) and once at its rate where its host ran
unsteady (`_steadier`); `retune` makes the tune alone again and
keeps the arrival cost. The tune also reads the engine's steps back from the open-loop
run's token times and fits on them beside the quiet measurements
(`planner.simulate.calibrate.on_steps`). The run past the knee gives, last, a full batch's
cost a sequence from its drain (`full_batch`) and how a TPOT strays where the queue stands
from its arriving side (`queued_spread`). A sweep whose answers reached the client in
bursts is refused (`bursts`): its timings say nothing of the engine's steps."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine

from planner.errors import InvalidInput, TargetError
from planner.simulate import EngineConfig, SimRequest
from planner.simulate.calibrate import (
    CALIBRATION_KEY,
    LOAD_PARAMS,
    LOAD_TRIES,
    PREFILL_PARAMS,
    SATURATED_PARAMS,
    SHAPE_PARAMS,
    SWEEP_PARAMS,
    Calibration,
    Check,
    LoadRun,
    Sweep,
    arrival_cost,
    bursts,
    checked,
    drift_of,
    full_batch,
    host_drift,
    load_rate,
    moved_since,
    noise_of,
    queued_spread,
    quiet_fit,
    saturated_rate,
    shape_cost,
    speed_span,
    tune,
    tuning_refused,
    unsteady_tune,
)
from planner.simulate.engine import SHAPE_PLANS
from planner.simulate.steps import Steps, TokenTimes, observed_steps
from planner.simulate.whatif import replay
from probes.engine.spec import engine_config, running_spec
from storage import queries as q
from storage.schemas import RunRow, TargetRow

# Runs one probe against the engine being calibrated: (kind, params) -> (run id, summary).
RunProbe = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


def stored(store: Engine, target: str) -> Calibration | None:
    """The calibration `kvscope simulate calibrate` stored for `target`, if any."""
    found = q.get_state(store, CALIBRATION_KEY.format(target))
    return None if found is None else Calibration.model_validate(found[0])


def save(store: Engine, target: str, calibration: Calibration) -> None:
    """Store `calibration` as `target`'s (what `stored` reads), over any before it."""
    q.put_state(store, CALIBRATION_KEY.format(target), calibration.model_dump(mode="json"))


def quiet(store: Engine, run: RunProbe, engine: EngineConfig) -> tuple[Calibration, Sweep]:
    """The calibration's quiet fit (a batch sweep and lone requests measured through `run`),
    and the sweep it read."""
    _, summary = run("batch_sweep", dict(SWEEP_PARAMS))
    sweep = Sweep.model_validate(summary)
    if why := bursts(sweep):
        raise TargetError(
            f"the calibration cannot fit this engine's batch sweep: {why}. Calibrate with "
            "fewer other processes on the machine"
        )
    prefill_id, _ = run("latency", dict(PREFILL_PARAMS))
    return quiet_fit(sweep, lone_records(store, prefill_id), engine), sweep


def lone_records(store: Engine, run_id: int) -> list[tuple[int, int, float, float]]:
    """A run's requests as (prompt tokens, output tokens, TTFT, E2E), as the quiet fit reads
    its lone requests."""
    frame = q.run_records(store, run_id)
    columns = (frame["prompt_tokens"], frame["output_tokens"], frame["ttft_s"], frame["e2e_s"])
    return list(zip(*columns, strict=True))


def calibrate(
    store: Engine, run: RunProbe, engine: EngineConfig, say: Callable[[str], None] = print
) -> Calibration:
    """Measure the engine through `run` (its runs stored in `store`) and fit the simulator."""
    fitted, sweep = quiet(store, run, engine)
    fitted = _shapes_priced(store, run, fitted, say)
    priced, past = _arrivals_priced(store, run, fitted, saturated_rate(fitted, sweep), say)
    tuned, again = _tuned(store, run, priced, load_rate(fitted, sweep), LOAD_PARAMS["seed"], say)
    if past is None:
        return tuned
    full = full_batch(tuned, *past, again)
    return full.model_copy(update={"queued_tpot": queued_spread(full, *past)})


def calibrate_anew(
    store: Engine,
    run: RunProbe,
    engine: EngineConfig,
    target: str,
    say: Callable[[str], None] = print,
) -> Calibration:
    """`calibrate` for `target` (not stored here), and where it had a calibration before,
    what the new one says of the host against it (`moved_since`), said."""
    try:
        previous = stored(store, target)
    except ValidationError:  # (stored in a form no longer read: replaced, not compared)
        previous = None
    now = time.time()
    fitted = calibrate(store, run, engine, say).model_copy(
        update={"target": target, "fitted_at": now, "tuned_at": now}
    )
    if previous is not None and (moved := moved_since(previous, fitted, now)):
        say(moved)
    return fitted


def retune(
    store: Engine,
    run: RunProbe,
    stored: Calibration,
    engine: EngineConfig,
    say: Callable[[str], None] = print,
    seed: int | None = None,
) -> Calibration:
    """The stored calibration's quiet fit tuned again on one new open-loop run at the rate it
    was tuned at (under a minute, two on an unsteady host, where the whole calibration takes
    several): a shared machine's speed moves by more within an hour than the simulator's own
    error (docs/simulator.md). Refused when `engine` is not the engine the quiet fit was made on.
    Its prompts are new (`seed`, by default from the clock): the calibration's own again
    would meet vLLM's prefix cache and read fast."""
    changed = [
        f"{key} {value} (fitted on {stored.engine[key]})"
        for key, value in ((k, getattr(engine, k)) for k in stored.engine)
        if value != stored.engine[key]
    ]
    if changed:
        raise InvalidInput(
            "the engine changed since its calibration: "
            + ", ".join(changed)
            + "; calibrate it anew (without --retune)"
        )
    rate = stored.tuned_rate or load_rate(stored)
    seed = time.time_ns() % 2**31 if seed is None else seed
    tuned, made = _tuned(store, run, stored, rate, seed, say)
    drift = drift_of(stored, made.requests, made.figures[0])
    say(f"the stored calibration's steps ran x{drift:.2f} as long in the new run")
    noise = noise_of(stored, made.requests, made.measured, drift)
    made_check = Check(at=time.time(), drift=drift, run="retune", noise=noise, queued=False)
    # (a tuning run never queued: `_tuned`). Tuned after its check: the checks since the
    # tune, which a prediction takes its scale from, are those of the new cost.
    return checked(tuned, made_check).model_copy(update={"tuned_at": time.time()})


def check(
    store: Engine,
    calibration: Calibration,
    run_id: int,
    engine: EngineConfig,
    now: float | None = None,
) -> Calibration:
    """`calibration` with a check of a later latency run on `engine` (its target's, as
    started for the run): how many times as long the run's steps took as the calibration
    says (`drift_of`), and where the run did not queue, the host's noise in it (`noise_of`).
    Refused for a run that is not a finished latency run, that ran before the calibration
    was tuned (its own runs) or that was checked already."""
    return _checked(calibration, _LaterRun.read(store, run_id), engine, now)


@dataclass(frozen=True)
class _LaterRun:
    """A finished latency run as a check reads it: its row once, its requests when first
    needed, however many calibrations it is checked against (`keep_check`)."""

    store: Engine
    row: RunRow

    @classmethod
    def read(cls, store: Engine, run_id: int, row: RunRow | None = None) -> _LaterRun:
        found = row or q.get_run(store, run_id)
        if found.kind != "latency" or found.status != "done":
            raise InvalidInput(
                f"run {run_id} is a {found.status} {found.kind} run: a check replays a "
                "finished latency run"
            )
        return cls(store, found)

    @cached_property
    def replayed(self) -> Replayed:
        return _replayed(self.store, self.row.id)[0]


def _checked(
    calibration: Calibration, run: _LaterRun, engine: EngineConfig, now: float | None
) -> Calibration:
    found, label = run.row, run_label(run.row.id)
    tuned = calibration.last_tuned
    if tuned is not None and (found.started_at or found.created_at) < tuned:
        raise InvalidInput(
            f"run {found.id} started before the calibration was tuned: check a latency run "
            "made after it"
        )
    if any(c.run == label for c in calibration.checks):
        raise InvalidInput(f"run {found.id} was checked already")
    loaded = LoadRun.model_validate(found.summary)
    if loaded.tune_figures is None:
        raise InvalidInput(f"run {found.id} had no request answered with two tokens or more")
    requests, measured = run.replayed
    drift = drift_of(calibration, requests, loaded.tune_figures[0], engine)
    queued = tuning_refused(loaded) is not None
    noise = [] if queued else noise_of(calibration, requests, measured, drift, engine)
    made = Check(at=now or time.time(), drift=drift, run=label, noise=noise, queued=queued)
    return checked(calibration, made)


def run_label(run_id: int) -> str:
    """A latency run's name in its calibration's checks (`Check.run`)."""
    return f"latency run {run_id}"


def engine_of(
    store: Engine, target: TargetRow, calibration: Calibration, data_dir: Path
) -> EngineConfig:
    """The engine a target's runs are made on, to replay them (`check`): a managed
    engine's as last started, or what an attached one was calibrated as."""
    if not target.managed:
        return calibration.config()
    return engine_config(running_spec(store, target.name), data_dir)


# How often a check is made again when the calibration changed under it (`keep_check`).
KEEP_TRIES = 3


def keep_check(
    store: Engine, target: TargetRow, run_id: int, data_dir: Path, row: RunRow | None = None
) -> Calibration:
    """`target`'s stored calibration with a check of a latency run (`row`, where the
    caller read it), stored: `check`'s refusals raised. A calibration written meanwhile (a
    retune, a new calibration, another check) is never overwritten: the check is made
    again on it, the run not read again, and TargetError after KEEP_TRIES."""
    key = CALIBRATION_KEY.format(target.name)
    run = _LaterRun.read(store, run_id, row)
    for _ in range(KEEP_TRIES):
        found = q.get_state(store, key)
        if found is None:
            raise InvalidInput(
                f"target {target.name} has no calibration yet: run kvscope simulate "
                f"calibrate --target {target.name}"
            )
        calibration = Calibration.model_validate(found[0])
        engine = engine_of(store, target, calibration, data_dir)
        made = _checked(calibration, run, engine, None)
        if q.replace_state(store, key, made.model_dump(mode="json"), found.version):
            return made
    raise TargetError(
        f"target {target.name}'s calibration changed {KEEP_TRIES} times while run {run_id} "
        "was checked against it: check it again"
    )


def check_finished(store: Engine, run_id: int, data_dir: Path) -> Check | None:
    """A finished latency run checked against its target's calibration and kept with it
    (the worker does this after each, so that the checks gather as the engine is probed);
    None where there is nothing to check: another kind of run, a target without a
    calibration, a run that `check` refuses (from before the tune, without two tokens)."""
    found = q.get_run(store, run_id)
    if found.kind != "latency" or found.target_id is None:
        return None
    target = q.get_target(store, found.target_id)
    try:
        return keep_check(store, target, run_id, data_dir, found).checks[-1]
    except InvalidInput:
        return None


# An open-loop run's requests as sent and their measured (TTFT, E2E), in the same order.
Replayed = tuple[list[SimRequest], list[tuple[float, float]]]


# A run past the knee whose drain ran more than UNSTEADY_DRAIN slower than its arrivals
# (`host_drift`) is made again once with prompts of its own, and the run whose drain ran
# faster kept: a full batch's cost is fitted on the drain as it ran (`full_batch`). The
# arrivals add the load generator's work on the same host (the log, "The load generator's
# own load"), so its drain runs as fast or faster (x1.00 to x1.32 in the runs logged since
# BA); one slower is a slow spell of the host. In BM and BQ (x0.85) it put every prediction
# with full batches 100-260 % long.
UNSTEADY_DRAIN = 0.10


@dataclass(frozen=True, slots=True)
class _PastKnee:
    """An open-loop run past the knee as `_arrivals_priced` read it."""

    cost: float | None  # the engine time an arrival takes (None: not read)
    how: str  # how it was read, or why not
    drift: float | None  # the host's speed while requests arrived over the drain's
    replayed: Replayed | None

    @property
    def slow_drain(self) -> bool:
        """Whether the host ran its drain more than UNSTEADY_DRAIN slower than its arrivals."""
        return self.drift is not None and self.drift < 1 - UNSTEADY_DRAIN


def _past_knee(store: Engine, run: RunProbe, seqs: int, rate: float, seed: int) -> _PastKnee:
    """An open-loop run at `rate` past the knee, made and read (`arrival_cost`, with
    `host_drift` from its steps)."""
    try:
        run_id, _ = run("latency", dict(SATURATED_PARAMS, rate=rate, seed=seed))
    except TargetError as err:
        return _PastKnee(None, f"failed: {err}", None, None)
    (requests, measured), start = _replayed(store, run_id)
    sends = [start + r.arrival_s for r in requests]
    drift, host = host_drift(steps_of(store, run_id).steps, sends, seqs)
    cost, how = arrival_cost(requests, measured, seqs, drift)
    how += f"; {host}" + ("" if drift else " (the drain taken as it ran)")
    return _PastKnee(cost, how, drift, (requests, measured))


def _arrivals_priced(
    store: Engine, run: RunProbe, fitted: Calibration, rate: float, say: Callable[[str], None]
) -> tuple[Calibration, Replayed | None]:
    """`fitted` with the engine time each arriving request takes, read from an open-loop run at
    `rate`, past the knee (`_past_knee`; made again where its drain ran in a slow spell), and
    that run; as it was, with the reason said through `say`, when that run fails or cannot
    tell (the rest of the calibration goes on without it)."""
    seqs, seed = fitted.config().max_num_seqs, int(SATURATED_PARAMS["seed"])
    past = _past_knee(store, run, seqs, rate, seed)
    if past.slow_drain:
        say(f"the run past the knee at {rate:g} req/s: {past.how}; its drain ran slower "
            "than its arrivals (a slow spell of the host): made again with prompts of its "
            "own")  # fmt: skip
        again = _past_knee(store, run, seqs, rate, seed + 1)
        if again.cost is not None and (again.drift or 0.0) > (past.drift or 0.0):
            past = again
        else:
            say(f"made again it {again.how}; the first kept")
    if past.cost is None or past.replayed is None:
        say(f"the run past the knee at {rate:g} req/s {past.how}; the calibration leaves "
            "arrivals without a cost")  # fmt: skip
        return fitted, None
    say(f"the run past the knee at {rate:g} req/s: {past.how}; each request arriving while "
        f"a batch runs takes {past.cost * 1000:.2f} ms of the engine's steps")  # fmt: skip
    priced = fitted.model_copy(update={"arrival_s": past.cost, "saturated_rate": rate})
    return priced, past.replayed


def _shapes_priced(
    store: Engine, run: RunProbe, fitted: Calibration, say: Callable[[str], None]
) -> Calibration:
    """`fitted` with what a step takes to plan its matmuls for a token count never run and
    for one evicted from those kept, read from lone prompts of many lengths in order
    (`shape_cost`); as it was, with the reason said through `say`, when that run fails or
    cannot tell."""
    try:
        run_id, _ = run("latency", dict(SHAPE_PARAMS))
    except TargetError as err:
        cost, how = None, f"failed: {err}"
    else:
        lone = [
            (int(p), int(o), float(ttft))
            for p, o, ttft, _ in lone_records(store, run_id)
            if all(x is not None and math.isfinite(x) for x in (p, o, ttft))
        ]
        cost, how = shape_cost(fitted, lone)
    if cost is None:
        say(f"the run of lone prompts of many lengths {how}; the calibration leaves new "
            "token counts without a cost")  # fmt: skip
        return fitted
    new, again = cost
    say(f"{how}; a step with a token count never run takes {new * 1000:.2f} ms more, one run "
        f"before but not among the last {SHAPE_PLANS} {again * 1000:.2f} ms")  # fmt: skip
    return fitted.model_copy(update={"shape_s": new, "replan_s": again})


def _replayed(store: Engine, run_id: int) -> tuple[Replayed, float]:
    """A stored open-loop run's requests as sent, and what each measured; and the first
    send's wall time, which the replay takes as 0 (the run's steps are on the wall clock)."""
    rows = q.replayable(store, run_id)
    start = min((row[0] for row in rows), default=0.0)
    return (replay(rows), q.replayed_latencies(store, run_id)), start


def steps_of(store: Engine, run_id: int) -> Steps:
    """The engine's steps behind a run's answers, read back from their token times."""
    return observed_steps(TokenTimes(*t) for t in q.token_times(store, run_id))


@dataclass(frozen=True, slots=True)
class _TuningRun:
    """The open-loop run a calibration was tuned on: called, the tune again on it of a
    calibration changed since (its steps already fitted on)."""

    requests: list[SimRequest]
    rate: float
    figures: tuple[float, float]
    measured: list[tuple[float, float]]

    def __call__(self, cal: Calibration) -> Calibration:
        return tune(cal, self.requests, self.rate, *self.figures, self.measured)


def _tuned(
    store: Engine,
    run: RunProbe,
    fitted: Calibration,
    rate: float,
    seed: int,
    say: Callable[[str], None],
) -> tuple[Calibration, _TuningRun]:
    """`fitted` tuned on an open-loop run at `rate`, made again at half the rate, with
    prompts of its own (`seed` + try), while it queued, and once more at its rate where its
    host ran unsteady (`_steadier`); and the tune on that run again, of a calibration
    changed since (its steps already fitted on)."""
    refused: list[str] = []
    for attempt in range(LOAD_TRIES):
        made = _tuning_run(store, run, fitted, rate, seed + attempt)
        if not isinstance(made, str):
            return _steadier(store, run, fitted, made, seed + LOAD_TRIES, say)
        refused.append(f"at {rate:g} req/s it {made}")
        say(f"the open-loop run to tune on {refused[-1]}; again at half the rate")
        rate = round(rate / 2, 2)
    raise TargetError(
        "the calibration could not be tuned: its open-loop run "
        + "; ".join(refused)
        + ". The host (API server and load generator beside the engine) cannot keep up: "
        "calibrate with fewer other processes on the machine"
    )


def _tuning_run(
    store: Engine, run: RunProbe, fitted: Calibration, rate: float, seed: int
) -> tuple[Calibration, _TuningRun] | str:
    """`fitted` tuned on one open-loop run at `rate` and that run; or why it was refused."""
    load_id, summary = run("latency", dict(LOAD_PARAMS, rate=rate, seed=seed))
    loaded = LoadRun.model_validate(summary)
    if (why := tuning_refused(loaded)) is not None:
        return why
    assert loaded.tune_figures is not None  # (a run without them is refused)
    (requests, measured), _ = _replayed(store, load_id)
    made = _TuningRun(requests, rate, loaded.tune_figures, measured)
    steps = steps_of(store, load_id).steps
    return tune(fitted, made.requests, rate, *made.figures, made.measured, steps), made


def _steadier(
    store: Engine,
    run: RunProbe,
    fitted: Calibration,
    first: tuple[Calibration, _TuningRun],
    seed: int,
    say: Callable[[str], None],
) -> tuple[Calibration, _TuningRun]:
    """`first`, or where its host's speed windows spread past UNSTEADY_SPAN, the run made
    once more at its rate (prompts of `seed`) if that one's spread less: a tune on a
    disturbed host fits the disturbance (docs/simulator.md, "Where it stands")."""
    unsteady = unsteady_tune(first[0])
    if unsteady is None:
        return first
    say(f"{unsteady}: the run to tune on made again")
    second = _tuning_run(store, run, fitted, first[1].rate, seed)
    if isinstance(second, str):
        say(f"the run made again {second}; the first kept")
        return first
    kept = min((first, second), key=lambda made: speed_span(made[0]))
    say(
        f"the run made again ran its windows x{speed_span(second[0]):.2f} apart; the "
        f"{'first' if kept is first else 'second'} kept"
    )
    return kept
