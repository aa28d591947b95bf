"""Load generator figures: the highest open-loop rate one core holds, and its own TTFT cost.

Against the loopback stand-in (tests/support/fake_openai.py) in its own process on its own
core, answering at once with 16 streamed tokens; the generator is pinned to another core.
Targets (issue 5): at least 500 requests/s with p99 send lateness under 5 ms, and a TTFT
overhead under 1 ms at p50 (the server's TTFT delay is 0, so all of TTFT is overhead). The
same workload driven by `vllm bench serve` from the engine venv is printed beside ours.

    .venv/bin/python -m benchmarks.loadgen [--runs 3] [--duration 3] [--no-vllm]
                                           [--transport lean|httpx]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from planner.workload import Arrival, FixedProfile
from probes.load.generator import RequestSpec, new_client, percentiles, run_open_loop
from probes.load.workloads import PromptBuilder
from probes.vllm.client import AsyncVllmClient, Endpoint, Target

ROOT = Path(__file__).resolve().parents[1]
# `--transport httpx` measures httpx's default stack, the reason probes/vllm/transport.py exists.
CLIENTS: dict[str, Callable[[], httpx.AsyncClient]] = {
    "lean": new_client,
    "httpx": lambda: httpx.AsyncClient(
        timeout=300.0, limits=httpx.Limits(max_connections=None, max_keepalive_connections=2000)
    ),
}
PROMPT_TOKENS, OUTPUT_TOKENS = 32, 16
LATENESS_LIMIT_S = 0.005


@dataclass(frozen=True)
class Figures:
    """One run, in milliseconds and requests per second."""

    lateness_p99_ms: float
    ttft_p50_ms: float  # from the scheduled time
    ttft_sent_p50_ms: float  # from the actual send, as vllm bench counts it
    achieved_rps: float
    ok: int
    errors: int


def _cores() -> tuple[int, int]:
    """(generator core, server core): two different ones when there are two."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[0], cores[-1]


def _pinned(core: int) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, {core})


def start_fake(core: int) -> tuple[subprocess.Popen[str], str]:
    """The stand-in server in its own process on `core`; returns it and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_openai", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_pinned(core),
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def build_prompts(url: str, n: int) -> list[RequestSpec]:
    """`n` prompts of exactly PROMPT_TOKENS tokens (by the server's /tokenize)."""
    async with new_client() as client:
        builder = PromptBuilder(AsyncVllmClient(Target(url), client), "tiny-llama", seed=1)
        profile = FixedProfile(prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS)
        return await builder.build(profile.shapes(n))


async def one_run(
    url: str, specs: list[RequestSpec], rate: float, seconds: float, transport: str
) -> Figures:
    """An open-loop Poisson run of `seconds` at `rate`, cycling through `specs`."""
    n = int(rate * seconds)
    schedule = Arrival(kind="poisson", rate=rate).offsets(n, seed=int(rate))
    requests = [specs[i % len(specs)] for i in range(n)]
    gc.collect()
    async with CLIENTS[transport]() as client:
        result = await run_open_loop(client, Endpoint(url, "tiny-llama"), requests, schedule)
    s = result.summary()
    sent_ttft = [
        r.first_token_ts - r.sent_ts
        for r in result.records
        if r.first_token_ts is not None and r.sent_ts is not None
    ]
    return Figures(
        lateness_p99_ms=(s.lateness_s.p99 or 0.0) * 1000,
        ttft_p50_ms=(s.ttft_s.p50 or 0.0) * 1000,
        ttft_sent_p50_ms=(percentiles(sent_ttft).p50 or 0.0) * 1000,
        achieved_rps=s.requests_per_s,
        ok=s.ok,
        errors=s.errors,
    )


def median_of(url: str, specs: list[RequestSpec], rate: float, args: argparse.Namespace) -> Figures:
    """Median of each figure over `args.runs` runs."""
    runs = [
        asyncio.run(one_run(url, specs, rate, args.duration, args.transport))
        for _ in range(args.runs)
    ]
    med = statistics.median
    return Figures(
        med(r.lateness_p99_ms for r in runs),
        med(r.ttft_p50_ms for r in runs),
        med(r.ttft_sent_p50_ms for r in runs),
        med(r.achieved_rps for r in runs),
        min(r.ok for r in runs),
        max(r.errors for r in runs),
    )


def holds(f: Figures) -> bool:
    return f.lateness_p99_ms < LATENESS_LIMIT_S * 1000 and f.errors == 0


def _line(rate: float, f: Figures) -> str:
    return (
        f"  {rate:6.0f} req/s: p99 lateness {f.lateness_p99_ms:6.2f} ms, TTFT p50 "
        f"{f.ttft_p50_ms:.2f} ms from schedule ({f.ttft_sent_p50_ms:.2f} ms from send), "
        f"achieved {f.achieved_rps:.0f} req/s, {f.errors} errors"
    )


def find_max_rate(url: str, specs: list[RequestSpec], args: argparse.Namespace) -> float:
    """Step up by `args.step` until a rate fails, then bisect to `args.step / 4`."""
    good, bad = 0.0, None
    rate = args.step
    while bad is None and rate <= args.max_rate:
        f = median_of(url, specs, rate, args)
        print(_line(rate, f), flush=True)
        if holds(f):
            good, rate = rate, rate + args.step
        else:
            bad = rate
    while bad is not None and bad - good > args.step / 4:
        rate = (good + bad) / 2
        f = median_of(url, specs, rate, args)
        print(_line(rate, f), flush=True)
        good, bad = (rate, bad) if holds(f) else (good, rate)
    return good


def vllm_bench(url: str, rate: float, core: int, args: argparse.Namespace) -> dict[str, float]:
    """One `vllm bench serve` run of the same workload; its saved result."""
    data = ROOT / ".data"
    env = dict(os.environ, VLLM_CACHE_ROOT=str(data / "vllm-cache"), TMPDIR=str(data / "tmp"))
    (data / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data / "tmp") as out:
        cmd = [
            str(args.engine_python),
            str(ROOT / "probes" / "engine" / "venv" / "vllm_entry.py"),
            "bench",
            "serve",
            "--backend=openai",
            f"--base-url={url}",
            "--endpoint=/v1/completions",
            "--model=tiny-llama",
            f"--tokenizer={args.tokenizer}",
            "--dataset-name=random",
            f"--random-input-len={PROMPT_TOKENS}",
            f"--random-output-len={OUTPUT_TOKENS}",
            f"--num-prompts={int(rate * args.duration)}",
            f"--request-rate={rate}",
            "--ignore-eos",
            "--disable-tqdm",
            "--percentile-metrics=ttft,e2el",
            "--metric-percentiles=50,99",
            "--save-result",
            f"--result-dir={out}",
            "--result-filename=result.json",
        ]
        subprocess.run(
            cmd, env=env, check=True, capture_output=True, text=True, preexec_fn=_pinned(core)
        )
        result: dict[str, float] = json.loads((Path(out) / "result.json").read_text())
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    ap.add_argument("--step", type=float, default=250.0, help="rate step of the search")
    ap.add_argument("--max-rate", type=float, default=5000.0)
    ap.add_argument("--compare-rates", default="100,500", help="rates for the TTFT comparison")
    ap.add_argument("--no-vllm", action="store_true", help="skip `vllm bench serve`")
    ap.add_argument("--transport", choices=sorted(CLIENTS), default="lean")
    ap.add_argument("--engine-python", type=Path, default=ROOT / ".engine-venv/bin/python")
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".data/models/tiny-llama")
    args = ap.parse_args()

    gen_core, server_core = _cores()
    os.sched_setaffinity(0, {gen_core})
    proc, url = start_fake(server_core)
    try:
        print(
            f"fake server at {url} on core {server_core}, generator on core {gen_core}; "
            f"{PROMPT_TOKENS}-token prompts, {OUTPUT_TOKENS} streamed tokens, Poisson "
            f"arrivals, median of {args.runs} runs of {args.duration:g} s",
            flush=True,
        )
        specs = asyncio.run(build_prompts(url, 1000))  # reused in turn: the server keeps nothing
        print("highest rate with p99 send lateness under 5 ms:", flush=True)
        best = find_max_rate(url, specs, args)
        print(f"=> holds {best:.0f} requests/s on one core (target >= 500)", flush=True)

        rates = [float(r) for r in args.compare_rates.split(",")]
        ours = {rate: median_of(url, specs, rate, args) for rate in rates}
        for rate, f in ours.items():
            print(
                f"TTFT overhead at {rate:.0f} req/s (server TTFT delay 0): p50 "
                f"{f.ttft_p50_ms:.2f} ms from schedule, {f.ttft_sent_p50_ms:.2f} ms from send "
                "(target < 1 ms)",
                flush=True,
            )
        if args.no_vllm or not args.engine_python.exists():
            print("vllm bench serve: skipped")
            return
        print("vllm bench serve, same server and workload (its TTFT counts from its send):")
        for rate in rates:
            res = [vllm_bench(url, rate, gen_core, args) for _ in range(args.runs)]
            med = statistics.median
            print(
                f"  {rate:6.0f} req/s: vllm bench TTFT p50 "
                f"{med(r['median_ttft_ms'] for r in res):.2f} ms (p99 "
                f"{med(r['p99_ttft_ms'] for r in res):.2f}), achieved "
                f"{med(r['request_throughput'] for r in res):.0f} req/s, "
                f"{max(r['failed'] for r in res):.0f} failed | kvscope TTFT p50 "
                f"{ours[rate].ttft_p50_ms:.2f} ms from schedule, "
                f"{ours[rate].ttft_sent_p50_ms:.2f} ms from send",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
