"""The simulator against the real CPU engine: calibrate on one set of measurements, then
predict workloads it was not fitted on and compare with latency probes on the engine.

Each workload is measured once with a latency probe, then simulated twice: on the run's own
requests (the same send times and lengths: the comparison of the figures), and on five
fresh draws of the same profile and rate (the seeds' 80 % interval on p99 TTFT, widened by
the calibration's fit error: does it cover the measurement?). Prints one row per workload
and figure, with the issue's targets and whether each is met.

    .venv/bin/python -m benchmarks.simulator
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from planner.simulate.calibrate import (
    PREFILL_PARAMS,
    SWEEP_PARAMS,
    Calibration,
    decode_samples,
    fit,
    prefill_samples,
    sweep_prefills,
)
from planner.simulate.whatif import Scenario, capacity_rps, predict, replay, sweep
from planner.workload import parse_profile
from probes.engine.spec import engine_config, parse_spec
from probes.worker import Worker
from storage import queries as q
from tests.support import injection

# The engine: the embedded CPU engine with 8 slots, chunked prefill in 512-token chunks.
ENGINE = {"max_num_seqs": 8, "enable_chunked_prefill": True, "max_num_batched_tokens": 512}
SMALL_KV = {"num_gpu_blocks_override": 96}  # 3,072 tokens: eight 1,280-token requests preempt
FIXED = {"kind": "fixed", "prompt_tokens": 256, "output_tokens": 64}
MIXED = {
    "kind": "lognormal",
    "prompt": {"median": 600, "sigma": 0.8, "min": 16, "max": 4000},
    "output": {"median": 80, "sigma": 0.6, "min": 8, "max": 400},
}
LONG = {"kind": "fixed", "prompt_tokens": 1024, "output_tokens": 256}
# (name, profile, share of the calibrated capacity, arrival, cv, small KV)
WORKLOADS: list[tuple[str, dict[str, Any], float, str, float, bool]] = [
    ("below the knee", FIXED, 0.5, "poisson", 1.0, False),
    ("above the knee", FIXED, 1.05, "poisson", 1.0, False),
    ("another length mix", MIXED, 0.6, "poisson", 1.0, False),
    ("bursty (CV 3)", FIXED, 0.5, "gamma", 3.0, False),
    ("KV small enough to preempt", LONG, 0.9, "poisson", 1.0, True),
]
TARGETS = {"ttft_p50": 0.10, "tpot_p50": 0.10, "ttft_p99": 0.20, "e2e_p99": 0.10, "preempt": 0.25}


def _rows(store: Any, run_id: int) -> list[tuple[float, int, int, str]]:
    frame = q.run_records(store, run_id)
    frame = frame[frame["status"] == "ok"]
    return [
        (float(t), int(p), int(o), "")
        for t, p, o in zip(
            frame["scheduled_ts"], frame["prompt_tokens"], frame["output_tokens"], strict=True
        )
    ]


def calibrate(worker: Worker, request: injection.Request) -> Calibration:
    sweep_run = request("batch_sweep", target=injection.NAME, timeout=900, **SWEEP_PARAMS)
    prefill_run = request("latency", target=injection.NAME, timeout=900, **PREFILL_PARAMS)
    for run in (sweep_run, prefill_run):
        if run.status != "done":
            raise SystemExit(f"the calibration's {run.kind} ended {run.status}: {run.error}")
    frame = q.run_records(worker.store, prefill_run.id)
    spec = parse_spec(q.get_started_spec(worker.store, injection.NAME) or {})
    config = engine_config(spec, worker.settings.data_dir)
    decodes = decode_samples(sweep_run.summary)
    prefills = sweep_prefills(sweep_run.summary)
    if len(decodes) < 2:
        raise SystemExit(f"the batch sweep gave {len(decodes)} decode samples: {sweep_run.summary}")
    return fit(
        decodes,
        prefills + prefill_samples(zip(frame["prompt_tokens"], frame["ttft_s"], strict=True)),
        config,
    )


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or not meas:
        return None
    return pred / meas - 1


def _fmt(x: float | None, unit: float) -> str:
    return "-" if x is None else f"{x * unit:,.0f}"


HEADER = (
    "| workload | rate/s | figure | measured | predicted | error | target | met |\n"
    "|---|---|---|---|---|---|---|---|"
)


def rows(name: str, rate: float, m: dict[str, Any], p: Any, fresh: Any, tally: list[int]) -> None:
    """Print one workload's rows; add (met, figures, covered) to `tally`."""
    figures = [
        ("TTFT p50", "ttft_p50", m["ttft_s"]["p50"], p.ttft_s.p50),
        ("TPOT p50", "tpot_p50", m["tpot_s"]["p50"], p.tpot_s.p50),
        ("TTFT p99", "ttft_p99", m["ttft_s"]["p99"], p.ttft_s.p99),
        ("E2E p99", "e2e_p99", m["e2e_s"]["p99"], p.e2e_s.p99),
        ("preemptions", "preempt", m.get("preemptions"), float(p.preemptions)),
    ]
    for label, key, meas, pred in figures:
        if key == "preempt" and not meas and not pred:
            continue
        err = _err(pred, meas)
        ok = err is not None and abs(err) <= TARGETS[key]
        tally[0] += ok
        tally[1] += 1
        unit = 1 if key == "preempt" else 1000
        print(
            f"| {name} | {rate:g} | {label} | {_fmt(meas, unit)} | {_fmt(pred, unit)} | "
            f"{'-' if err is None else f'{err:+.0%}'} | ±{TARGETS[key]:.0%} | "
            f"{'yes' if ok else 'no'} |",
            flush=True,
        )
    band = fresh.ttft_p99
    measured = m["ttft_s"]["p99"]
    inside = band is not None and measured is not None and band.low <= measured <= band.high
    tally[2] += inside
    shown = "none" if band is None else f"{band.low * 1000:,.0f}-{band.high * 1000:,.0f}"
    print(
        f"| {name} | {rate:g} | TTFT p99 80% interval | {_fmt(measured, 1000)} | {shown} | | "
        f"covers | {'yes' if inside else 'no'} |",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals a run")
    args = ap.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    tally = [0, 0, 0]
    started = time.time()
    with injection.diag_worker(venv, ENGINE) as (worker, request):
        cal = calibrate(worker, request)
        print(cal.describe(), flush=True)
        print(
            f"  step = {cal.overhead_s * 1000:.2f} ms + {cal.token_s * 1e6:.2f} us a token + "
            f"{cal.seq_s * 1e6:.0f} us a sequence + {cal.pair_s * 1e9:.1f} ns an attention "
            f"pair; API {cal.api_s * 1000:.2f} ms",
            flush=True,
        )
        print(HEADER, flush=True)
        config = cal.config()
        small = False
        for name, profile, share, arrival, cv, small_kv in WORKLOADS:
            if small_kv != small:
                spec = parse_spec(q.get_started_spec(worker.store, injection.NAME) or {})
                spec = spec.model_copy(update=SMALL_KV if small_kv else {})
                q.save_engine_spec(worker.store, spec.name, spec.model_dump())
                done = request("engine_restart", name=spec.name, timeout=600)
                if done.status != "done":
                    print(f"| {name} | | the restart failed: {done.error} |", flush=True)
                    continue
                injection.wait_serving(worker)
                config = engine_config(spec, worker.settings.data_dir)
                small = small_kv
            scenario = Scenario(
                config=config,
                cost=cal.cost(),
                profile=parse_profile(profile),
                requests=400,
                arrival=arrival,
                cv=cv,
                source="calibrated",
                api_s=cal.api_s,
                residuals=(cal.residual_low, cal.residual_high),
            )
            rate = round(share * capacity_rps(scenario), 2)
            run = request(
                "latency", target=injection.NAME, timeout=1200, rate=rate,
                duration_s=args.duration, arrival=arrival, cv=cv, profile=profile,
                request_timeout_s=300, seed=7,
            )  # fmt: skip
            if run.status != "done":
                print(f"| {name} | {rate:g} | the run ended {run.status}: {run.error} |")
                continue
            traffic = replay(_rows(worker.store, run.id))
            same = predict(scenario, rate, requests=traffic)
            fresh = sweep(replace(scenario, requests=len(traffic)), [rate], seeds=5)[0]
            rows(name, rate, run.summary, same, fresh, tally)
    print()
    print(
        f"{tally[0]}/{tally[1]} figures within their targets; the 80% interval covered the "
        f"measured p99 TTFT in {tally[2]}/{len(WORKLOADS)} workloads (target 70-90%); "
        f"{time.time() - started:.0f} s in all"
    )


if __name__ == "__main__":
    main()
