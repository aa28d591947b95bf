"""What an arrival costs the CPU engine, read three ways on the same runs past the knee.

One calibration as `kvscope simulate calibrate` makes it, then its run past the knee (Poisson,
256/64 tokens, at twice the capacity, 20 s) made again with other seeds. Each run is read:

- from its drain as it ran: the TPOT mean while requests arrived against that of the
  queue's drain after the last send, a minute apart (`arrival_cost` without a drift);
- from its drain at the arrivals' host speed (what a calibration uses): the same, the
  drain's TPOT taken at the ratio of a full batch's quiet steps while requests arrived
  (nothing sent near their start) to the drain's steps (`host_drift`);
- from its steps alone: the quiet steps against all the full batch's steps while
  requests arrived, (all - quiet) / (r all). This one reads high: near a send the API
  server streams late and sends two tokens as one, and the client sees one long step
  where the engine ran two (the share of tokens that came two to a chunk is printed).

It prints one row per run, and each reading's spread over the runs: runs of one engine
minutes apart should read alike.

    .venv/bin/python -m benchmarks.arrival_steps            # ~6 min
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

import numpy as np

from benchmarks.simulator import ENGINE, calibrate, started_config
from planner.simulate.calibrate import SATURATED_PARAMS, arrival_cost, host_drift, quiet_steps
from planner.simulate.steps import TokenTimes, observed_steps
from planner.simulate.whatif import replay
from probes.worker import Worker
from storage import queries as q
from tests.support import injection


class _Row(NamedTuple):
    seed: int
    sent: float  # requests a second
    plain: float | None  # ms an arrival, by reading
    host: float | None
    steps: float | None
    drift: float | None  # the host's speed while arriving over the drain's
    merged: tuple[float, float]  # share of tokens two to a chunk: while arriving, in the drain


def _read(worker: Worker, run_id: int, seed: int, seqs: int) -> _Row:
    rows = q.replayable(worker.store, run_id)
    sends = np.array(sorted(row[0] for row in rows))
    requests = replay(rows)
    measured = q.replayed_latencies(worker.store, run_id)
    tokens = q.token_times(worker.store, run_id)
    steps = observed_steps(TokenTimes(*t) for t in tokens).steps
    drift, _ = host_drift(steps, sends.tolist(), seqs)
    plain, _ = arrival_cost(requests, measured, seqs)
    host, _ = arrival_cost(requests, measured, seqs, drift)
    # The steps alone: the quiet ones against all, both while requests arrived.
    rate = len(sends) / (sends[-1] - sends[0])
    read = quiet_steps(steps, sends.tolist(), seqs)
    alone = None
    if read is not None and len(read.quiet):
        every, calm = float(np.mean(read.arriving)), float(np.mean(read.quiet))
        alone = (every - calm) / (rate * every)
    # Tokens two to a chunk: a request's output tokens beyond its chunks, by where it ran
    # (both lists are the answered requests in the order sent).
    extra = {True: [0, 0], False: [0, 0]}
    for (_, prompt, out, _), (held, first, gaps) in zip(rows, tokens, strict=True):
        if out >= 2 and held == prompt:
            side = extra[first + sum(gaps) <= sends[-1]]
            side[0] += max(0, out - 1 - len(gaps))
            side[1] += out - 1
    share = [a / b if b else 0.0 for a, b in (extra[True], extra[False])]

    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1000

    return _Row(seed, rate, ms(plain), ms(host), ms(alone), drift, (share[0], share[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[31, 37, 41, 43])
    args = ap.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    rows: list[_Row] = []
    with injection.diag_worker(venv, ENGINE) as (worker, request):
        cal = calibrate(worker, request)
        print(cal.describe(), flush=True)
        seqs = started_config(worker).max_num_seqs
        rate = cal.saturated_rate
        if rate is None:
            raise SystemExit("the calibration priced no arrival: its run past the knee failed")
        own = max(r.id for r in q.list_runs(worker.store, "latency")
                  if r.params.get("seed") == SATURATED_PARAMS["seed"])  # fmt: skip
        rows.append(_read(worker, own, SATURATED_PARAMS["seed"], seqs))
        for seed in args.seeds:
            run = request("latency", target=injection.NAME, timeout=900,
                          **dict(SATURATED_PARAMS, rate=rate, seed=seed))  # fmt: skip
            if run.status != "done":
                raise SystemExit(f"the run with seed {seed} ended {run.status}: {run.error}")
            rows.append(_read(worker, run.id, seed, seqs))
            print(f"seed {seed} read", flush=True)

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    print()
    print("| seed | sent req/s | the drain as it ran (ms) | at the arrivals' host speed "
          "| the steps alone | host: arriving / drain | tokens two to a chunk: arriving, "
          "drain |")  # fmt: skip
    print("|---" * 7 + "|")
    for r in rows:
        drift = "-" if r.drift is None else f"{r.drift:.3f}"
        print(f"| {r.seed} | {r.sent:.1f} | {ms(r.plain)} | {ms(r.host)} | {ms(r.steps)} | "
              f"{drift} | {r.merged[0]:.1%}, {r.merged[1]:.1%} |")  # fmt: skip
    for name, readings in (("the drain as it ran", [r.plain for r in rows]),
                           ("at the arrivals' host speed", [r.host for r in rows]),
                           ("the steps alone", [r.steps for r in rows])):  # fmt: skip
        read = [x for x in readings if x is not None]
        if read:
            print(f"{name}: {min(read):.2f}-{max(read):.2f} ms over {len(read)} runs, "
                  f"median {np.median(read):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
