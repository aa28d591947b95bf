"""Where the queue is past the knee on the CPU engine: for open-loop runs at a few rates (the
fidelity engine of benchmarks/simulator.py, 256/64 tokens, Poisson, 40 s), the client's
TTFT against the engine's own queue time, the rate it served while the arrivals lasted
(answers finished from 10 s in to the last send, over that time), its steps a second, and
the CPU each process took (the engine core, the API server, this process's load generator).

    .venv/bin/python -m benchmarks.overload                  # ~4 min
    .venv/bin/python -m benchmarks.overload --rates 12 30 40 51
    .venv/bin/python -m benchmarks.overload --predict        # ~10 min, calibrated first

With `--predict` the engine is calibrated first (as `kvscope simulate calibrate`), and each
run is predicted on its own requests (one draw of the host), to set the simulator's TTFT
beside the engine's where the engine saturates.

Each run's steps are also read back from its token times (planner/simulate/steps.py): by
what they carried (requests decoding, prefills finished), how many and their median length,
and with `--predict` what the calibrated step cost says the same steps take. And its TPOT by
when the requests began decoding, in windows of 10 s: while requests still arrive and after
(the queue's drain, the batch as full).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from benchmarks.engine import cpu_seconds, proc_label
from benchmarks.simulator import ENGINE, FIXED, probe_runner, started_config
from planner.simulate.calibrate import SWEEP_CONTEXT, Calibration, Sweep
from planner.simulate.engine import EngineConfig, SimRequest, simulate
from planner.simulate.setup import measured_by
from planner.simulate.whatif import Scenario, predict, replay
from planner.workload import parse_profile
from probes.engine import group_pids
from probes.kinds import calibration
from probes.kinds.latency import Measurement
from storage import queries as q
from tests.support import injection


def cpu_used(engine_pid: int) -> dict[str, float]:
    """CPU seconds so far: the engine's core and its API server (its process group), and
    this process, whose load generator sends the runs."""
    out = {"engine core": 0.0, "API server": 0.0, "load generator": cpu_seconds(os.getpid())}
    for pid in group_pids(engine_pid):
        try:
            label, used = proc_label(pid), cpu_seconds(pid)
        except OSError:  # gone since the group was read
            continue
        if label.startswith("VLLM::EngineCor"):
            out["engine core"] += used
        elif label == "API server":
            out["API server"] += used
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[12.0, 40.0, 51.0])
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals a run")
    ap.add_argument("--predict", action="store_true", help="calibrate, then predict each run")
    args = ap.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    print(
        "| rate/s | served/s | client TTFT p50 ms | engine queue mean ms | TPOT p50 ms | "
        "engine steps/s | CPU, cores: engine core | API server | load generator |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    predicted: list[str] = []
    step_table: list[str] = []
    window_table: list[str] = []
    with injection.diag_worker(venv, ENGINE) as (worker, request):
        config = started_config(worker)
        cal = None
        if args.predict:
            cal, sweep = calibrate_keeping_sweep(worker, request, config)
            print(cal.describe(), flush=True)
            print(full_batch(sweep, cal, config), flush=True)
        for rate in args.rates:
            engine_pid = worker.engines[injection.NAME].state.pid
            if engine_pid is None:
                raise SystemExit("the engine is not running")
            before, started = cpu_used(engine_pid), time.monotonic()
            run = request(
                "latency", target=injection.NAME, timeout=1200, rate=rate,
                duration_s=args.duration, arrival="poisson", profile=FIXED,
                request_timeout_s=300, seed=7,
            )  # fmt: skip
            wall = time.monotonic() - started
            used = {k: (v - before[k]) / wall for k, v in cpu_used(engine_pid).items()}
            if run.status != "done":
                print(f"| {rate:g} | the run ended {run.status}: {run.error} |", flush=True)
                continue
            m = Measurement.model_validate(run.summary)
            served = served_while_arriving(worker.store, run.id)
            e = m.engine
            steps = e.iteration_tokens.count if e and e.iteration_tokens else None
            queue = e.queue_time.mean if e else None
            print(
                f"| {rate:g} | {'-' if served is None else f'{served:.1f}'} | "
                f"{_ms(m.ttft_s.p50)} | {_ms(queue)} | "
                f"{_ms(m.tpot_s.p50, 1)} | {'-' if steps is None else f'{steps / wall:.0f}'} | "
                + " | ".join(f"{used[k]:.2f}" for k in ("engine core", "API server",
                                                       "load generator"))
                + " |",
                flush=True,
            )  # fmt: skip
            step_table += step_rows(worker.store, run.id, rate, config, cal)
            window_table += tpot_windows(worker.store, run.id, rate)
            if cal is not None:
                traffic = replay(q.replayable(worker.store, run.id))
                base = Scenario(
                    config=config, cost=cal.cost(),
                    profile=parse_profile(FIXED), requests=len(traffic), arrival="poisson",
                    source="calibrated",
                )  # fmt: skip
                p = predict(measured_by(base, cal), rate, 0, requests=traffic)
                sim = simulated_served(traffic, cal, config)
                predicted.append(
                    f"| {rate:g} | {_ms(m.ttft_s.p50)}, {_ms(m.ttft_s.p99)} | "
                    f"{_ms(p.ttft_s.p50)}, {_ms(p.ttft_s.p99)} | "
                    f"{'-' if served is None else f'{served:.1f}'} | "
                    f"{'-' if sim is None else f'{sim:.1f}'} |"
                )
    print(
        "\n| rate/s | steps: decoding + prefills finished | seen | median ms | mean ms | "
        "calibrated step cost ms |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(step_table))
    print(
        "\n| rate/s | began decoding, s from the first send | while arriving | requests | "
        "TPOT mean ms | TPOT p50 ms |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(window_table))
    if predicted:
        print(
            "\n| rate/s | measured TTFT p50, p99 ms | calibrated prediction | served/s | "
            "simulated served/s |"
        )
        print("|---|---|---|---|---|")
        print("\n".join(predicted))


def calibrate_keeping_sweep(
    worker: Any, request: injection.Request, config: EngineConfig
) -> tuple[Calibration, Sweep]:
    """As `kvscope simulate calibrate` does, keeping the batch sweep it measured."""
    run = probe_runner(request, "the calibration's")
    sweeps: list[Sweep] = []

    def keeping(kind: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        run_id, summary = run(kind, params)
        if kind == "batch_sweep":
            sweeps.append(Sweep.model_validate(summary))
        return run_id, summary

    return calibration.calibrate(worker.store, keeping, config), sweeps[0]


def full_batch(sweep: Sweep, cal: Calibration, config: EngineConfig) -> str:
    """The sweep's closed loop at its highest concurrency against the calibrated
    simulator's: requests completed a second, and TPOT p50 and mean."""
    top = max(sweep.steps, key=lambda x: x.concurrency)
    prompt, output = SWEEP_CONTEXT
    backlog = [SimRequest(0.0, prompt, output) for _ in range(40 * top.concurrency)]
    closed = replace(config, max_num_seqs=top.concurrency)
    done = [r for r in simulate(backlog, closed, cal.cost()) if r.e2e_s is not None]
    rate = len(done) / max(r.e2e_s or 0.0 for r in done)
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    return (
        f"the sweep's closed loop at concurrency {top.concurrency}: "
        f"{top.requests_per_s or 0:.1f} req/s, TPOT p50 {_ms(top.tpot_s.p50, 2)} ms, mean "
        f"{_ms(top.tpot_s.mean, 2)} ms; the calibrated simulator's: {rate:.1f} req/s, TPOT "
        f"p50 {_ms(float(np.median(tpots)), 2)} ms, mean {_ms(float(np.mean(tpots)), 2)} ms"
    )


# A kind of step is listed where the run had at least this many of it.
STEPS_LISTED = 30


def step_rows(
    store: Engine, run_id: int, rate: float, config: EngineConfig, cal: Calibration | None
) -> list[str]:
    """Rows of the step table for one run: its steps by kind (requests decoding, prefills
    finished), each kind's count, median and mean length, and the calibrated cost's median;
    then the run's measured step time over the calibrated cost's for the same steps (the
    mean counts the stalls a median hides)."""
    seen = calibration.steps_of(store, run_id)
    cost = cal.cost() if cal is not None else None
    kinds: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for s in seen.steps:
        if s.seconds is not None:
            model = s.modelled_s(cost, config) if cost is not None else float("nan")
            kinds.setdefault((s.decodes, len(s.prefills)), []).append((s.seconds, model))
    rows = []
    for (decodes, prefills), got in sorted(kinds.items()):
        if len(got) >= STEPS_LISTED:
            measured, model = np.asarray(got).T
            rows.append(
                f"| {rate:g} | {decodes} + {prefills} | {len(got)} | "
                f"{_ms(float(np.median(measured)), 2)} | {_ms(float(np.mean(measured)), 2)} | "
                f"{_ms(float(np.median(model)), 2) if cal else '-'} |"
            )
    total = np.asarray([x for got in kinds.values() for x in got]).reshape(-1, 2)
    ratio = (
        f"; measured over calibrated: {total[:, 0].sum() / total[:, 1].sum():.2f} in all, "
        f"{np.median(total[:, 0] / total[:, 1]):.2f} the median step"
        if cal is not None and len(total)
        else ""
    )
    left = f"{seen.merged} of {len(seen.steps) + seen.merged} bunches merged steps{ratio}"
    return [*rows, f"| {rate:g} | {left} | | | | |"]


TPOT_WINDOW_S = 10.0


def tpot_windows(store: Engine, run_id: int, rate: float) -> list[str]:
    """Rows of the TPOT-by-window table for one run: its answered requests by when they
    began decoding (first token, from the run's first send), TPOT mean and median in each
    window of TPOT_WINDOW_S with five requests or more, and whether requests still arrived
    then (past the last send the batch drains the queue with nothing arriving)."""
    frame = q.run_records(store, run_id)
    frame = frame[(frame["status"] == "ok") & frame["tpot_s"].notna()]
    if frame.empty:
        return []
    first_send = frame["scheduled_ts"].min()
    last_send = frame["scheduled_ts"].max() - first_send
    began = frame["scheduled_ts"] - first_send + frame["ttft_s"]
    window = (began // TPOT_WINDOW_S).astype(int)
    rows = []
    for i in sorted(set(window)):
        got = frame["tpot_s"][window == i]
        if len(got) < 5:
            continue
        lo, hi = i * TPOT_WINDOW_S, (i + 1) * TPOT_WINDOW_S
        arriving = "yes" if hi <= last_send else "no" if lo >= last_send else "partly"
        rows.append(
            f"| {rate:g} | {lo:g}-{hi:g} | {arriving} | {len(got)} | "
            f"{_ms(float(got.mean()), 2)} | {_ms(float(got.median()), 2)} |"
        )
    return rows


def simulated_served(
    traffic: list[SimRequest], cal: Calibration, config: EngineConfig
) -> float | None:
    """`served_while_arriving` of the calibrated simulator's replay of `traffic` (one
    run, the host at its median speed)."""
    done = [
        r.request.arrival_s + r.e2e_s + cal.request_s
        for r in simulate(traffic, config, cal.cost())
        if r.e2e_s is not None
    ]
    return served_rate([r.arrival_s for r in traffic], done)


def served_while_arriving(store: Engine, run_id: int) -> float | None:
    """Answers the engine finished while the arrivals lasted, a second (`served_rate`)."""
    frame = q.run_records(store, run_id)
    frame = frame[frame["status"] == "ok"]
    return served_rate(frame["scheduled_ts"], frame["scheduled_ts"] + frame["e2e_s"])


def served_rate(
    sent: Sequence[float] | pd.Series, done: Sequence[float] | pd.Series, settle_s: float = 10.0
) -> float | None:
    """Answers finished from `settle_s` after the first send to the last send, a second
    (None when the sends spanned no more than that)."""
    if not len(sent):
        return None
    start, end = float(np.min(sent)) + settle_s, float(np.max(sent))
    if end <= start:
        return None
    finished = np.asarray(done, dtype=float)
    return float(((finished >= start) & (finished <= end)).sum() / (end - start))


def _ms(seconds: float | None, digits: int = 0) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.{digits}f}"


if __name__ == "__main__":
    main()
