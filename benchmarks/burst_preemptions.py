"""Preemptions of a burst, vLLM's against the simulator's: requests whose answers outgrow
the KV cache, all sent at once. With nothing arriving later, which request runs, waits or
is preempted at each step follows from token counts and blocks, not from how long a step
takes, so this figure can be judged on a shared machine where timings cannot (the
fidelity benchmark's preemption counts follow the step speed). The steps the engine took
(the count of vLLM's `iteration_tokens` histogram) are compared the same way: the length
of the schedule, decodes, prefill chunks and recomputation included.

Two engines: the embedded one's settings (511 blocks of 32, 128 sequences, 2,048 tokens a
step) and the fidelity benchmark's small cache (95 blocks, 8 sequences, 512 tokens a step),
each with prefix caching on (vLLM's default) and off. Each burst is sent with prompts of
its own several times, with vLLM's scheduler paused until it is queued (`tests.support.held`:
a starved API server otherwise hands a burst on over many steps); the simulator gets the
same requests, all at once, as the scheduler gets them when it resumes.

    .venv/bin/python -m benchmarks.burst_preemptions             # ~6 min
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.simulator import ENGINE, SMALL_KV, started_config
from planner.simulate import EngineStats, SimRequest, StepCost, simulate
from probes.kinds.latency import Result
from storage import queries as q
from tests.support import held, injection

# (engine settings, label, bursts as (requests, prompt tokens, answer tokens))
EMBEDDED = {"max_num_seqs": 128, "enable_chunked_prefill": True, "max_num_batched_tokens": 2048}
ENGINES: tuple[tuple[dict[str, Any], str, tuple[tuple[int, int, int], ...]], ...] = (
    (EMBEDDED, "embedded settings", ((24, 256, 700), (40, 256, 700), (32, 512, 600))),
    (ENGINE | SMALL_KV, "small cache", ((8, 256, 512), (12, 128, 700), (16, 256, 512))),
)
RATE = 500.0  # requests a second: a burst, 2 ms apart
# Any step cost: with no later arrivals the count does not depend on it (checked: the same
# counts with all the requests at 0 s).
COST = StepCost(0.004, 0.0, 0.0, 3e-6, additive=True, seq_s=1e-4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each burst")
    args = ap.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    print("| engine | prefix caching | burst (requests x prompt/answer) | preemptions: vLLM "
          "(each run) | simulator | error of the median | steps: vLLM (each run) | simulator "
          "|")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    seed = 20_000
    for settings, label, bursts in ENGINES:
        for caching in (True, False):
            spec = settings | {"enable_prefix_caching": caching}
            with injection.diag_worker(venv, spec, held.dev_mode) as (worker, request):
                url = q.get_target(worker.store, injection.NAME).base_url
                config = started_config(worker)
                for n, prompt, output in bursts:
                    counts, steps = [], []
                    for _ in range(args.repeats):
                        seed += 1
                        done = held.held_run(worker.store, request, url, dict(
                            target=injection.NAME, timeout=900, rate=RATE, duration_s=1.0,
                            arrival="constant", seed=seed, prompt_tokens=prompt,
                            output_tokens=output, max_requests=n, request_timeout_s=600,
                        ))  # fmt: skip
                        if done.status != "done":
                            raise SystemExit(f"the burst ended {done.status}: {done.error}")
                        result = Result.model_validate(done.summary)
                        engine = result.engine
                        if engine is None or engine.preemptions is None:
                            raise SystemExit("the engine's preemption counter was not read")
                        counts.append(int(engine.preemptions))
                        if engine.iteration_tokens is not None:
                            steps.append(int(engine.iteration_tokens.count or 0))
                    stats = EngineStats()
                    burst = [SimRequest(0.0, prompt, output) for _ in range(n)]  # (held)
                    list(simulate(burst, config, COST, stats))
                    median = sorted(counts)[len(counts) // 2]
                    error = (stats.preemptions - median) / median if median else float("nan")
                    print(f"| {label} ({config.num_blocks} blocks) | {'on' if caching else 'off'} "
                          f"| {n} x {prompt}/{output} | {', '.join(map(str, counts))} "
                          f"| {stats.preemptions} | {error:+.0%} | {', '.join(map(str, steps))} "
                          f"| {stats.steps} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
