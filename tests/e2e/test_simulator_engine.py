"""The simulator's scheduler against vLLM's on the real CPU engine: counts that do not
depend on the machine's speed, so they hold on a busy machine.

- The prefix cache: a latency probe sends a workload that shares text at a low rate (about
  one request at a time); its result carries the engine's own prefix-cache counters over
  the run. The simulator, given the same shapes and send times and the engine's block
  count, must count the same prompt tokens looked up and found there, to the token: a hit
  is whole blocks of text sent before, as in vLLM.
- Preemptions: a burst of requests whose answers outgrow the KV cache, all sent at once.
  With nothing arriving later, which request runs, waits or is preempted at each step
  follows from token counts and blocks, not from how long a step takes, so the simulator
  must count what vLLM counts.
"""

from __future__ import annotations

from typing import Any

import pytest

from planner.simulate import EngineStats, SimRequest, StepCost, simulate
from planner.simulate.whatif import as_request
from planner.workload import Arrival, parse_profile
from probes.engine.spec import engine_config, parse_spec
from probes.kinds.latency import Result, notes
from storage import queries as q
from storage.settings import Settings
from tests.e2e.conftest import API_KEY, LiveWorker
from tests.support.held import held_run

pytestmark = pytest.mark.engine

PROFILES: dict[str, dict[str, Any]] = {
    # Two system prompts of 500 tokens (15 full blocks of 32, and 20 tokens more), each
    # followed by a message of its own.
    "shared-prefix": {
        "kind": "shared_prefix",
        "prefix_tokens": 500,
        "prefixes": 2,
        "suffix": {"median": 40, "sigma": 0.5, "min": 4, "max": 200},
        "output": {"median": 4, "sigma": 0.3, "min": 2, "max": 8},
    },
    # Three chat sessions of four turns side by side: each turn repeats the last one's
    # prompt verbatim, then text standing in for its answer, then a new message.
    "multi-turn": {
        "kind": "multi_turn",
        "turns": 4,
        "sessions": 3,
        "first_prompt": {"median": 200, "sigma": 0.3, "min": 64, "max": 400},
        "next_prompt": {"median": 60, "sigma": 0.3, "min": 8, "max": 200},
        "output": {"median": 24, "sigma": 0.3, "min": 8, "max": 60},
    },
}
RATE, DURATION_S = 2.0, 10.0


@pytest.mark.parametrize("name", PROFILES)
def test_the_simulated_prefix_cache_counts_what_vllms_counts(
    live: LiveWorker, cpu_engine: str, e2e_settings: Settings, name: str
) -> None:
    profile, seed = PROFILES[name], 9_731 + len(name)  # (prompts of their own per case)
    run = live.request(
        "latency", timeout=300, target="embedded", profile=profile, rate=RATE,
        duration_s=DURATION_S, arrival="constant", seed=seed,
    )  # fmt: skip
    assert run.status == "done", run.error
    result = Result.model_validate(run.summary)
    assert result.engine is not None and result.requests == result.ok
    measured = (result.engine.prefix_queries, result.engine.prefix_hits)

    times = Arrival(kind="constant", rate=RATE).within(DURATION_S, seed)
    shapes = parse_profile(profile).shapes(len(times), seed)
    assert len(times) == result.requests == 20
    spec = parse_spec(q.get_started_spec(live.worker.store, "embedded") or {})
    stats = EngineStats()
    cost = StepCost(0.01, 0.0, 0.0, 1e-5, additive=True)  # (any: about one at a time)
    replayed = list(simulate(
        [as_request(t, s) for t, s in zip(times, shapes, strict=True)],
        engine_config(spec, e2e_settings.data_dir), cost, stats,
    ))  # fmt: skip
    assert len(replayed) == len(times) and stats.preemptions == 0
    if name == "shared-prefix":
        # Each prefix's first request finds nothing; every later one its 15 full blocks.
        assert len({s.prefix for s in shapes}) == 2
        assert stats.prefix_hits == (len(times) - 2) * 15 * 32
    assert stats.prefix_hits > 0.3 * stats.prefix_queries
    assert measured == (stats.prefix_queries, stats.prefix_hits)
    assert f"served {stats.prefix_hits / stats.prefix_queries:.0%}" in " ".join(notes(result))


def test_a_burst_that_outgrows_the_kv_cache_preempts_as_often_as_vllm(
    live: LiveWorker, cpu_engine: str, e2e_settings: Settings
) -> None:
    """24 requests of 256 prompt and 700 answer tokens at once: 23,000 tokens of KV against
    the engine's 16,352 (511 blocks of 32). Measured four times on this engine: 7
    preemptions each time, as the simulator says; with a block count 10 % off either way
    it says 9 or 6. The issue's target is within 25 %. The steps the engine took (its
    `iteration_tokens` histogram's count) are the schedule's length: 987 and 988 measured,
    990 simulated with the requests 2 ms apart, on a quiet machine; held (below), 988 in
    every run and 988 simulated with them all at once.

    Where the API server is starved (CI, a core kept spinning beside the engine) a burst
    sent as it comes reaches the scheduler over a second or more, and the count follows how
    it trickled in: the simulator says 5 to 9 for the 24 spread at random over 0.8-1.6 s;
    CI once measured 5, and two spinning processes beside the suite gave 0-5 preemptions in
    1,208-3,298 steps, four tries out of four. So the scheduler is paused (vLLM's /pause,
    keeping what arrives) while the burst is sent and resumed once the API server has had
    time to queue it. The engine's steps say whether it did: a burst that took over 5 %
    more steps than the simulator's did not reach the scheduler whole, and is sent again
    with prompts of its own (the same ones would meet the prefix cache), three times at
    most."""
    n, prompt, output, rate = 24, 256, 700, 500.0
    spec = parse_spec(q.get_started_spec(live.worker.store, "embedded") or {})
    config = engine_config(spec, e2e_settings.data_dir)
    stats = EngineStats()
    cost = StepCost(0.004, 0.0, 0.0, 3e-6, additive=True, seq_s=1e-4)  # (any: see above)
    # All at once: the scheduler finds them queued when it resumes.
    list(simulate([SimRequest(0.0, prompt, output) for _ in range(n)], config, cost, stats))
    assert stats.preemptions == 7
    tries: list[tuple[float, float]] = []
    for attempt in range(3):
        run = held_run(live.worker.store, live.request, cpu_engine, {
            "target": "embedded", "timeout": 600, "rate": rate, "duration_s": 1.0,
            "arrival": "constant", "prompt_tokens": prompt, "output_tokens": output,
            "max_requests": n, "seed": 4_417 + attempt, "request_timeout_s": 300,
        }, api_key=API_KEY)  # fmt: skip
        assert run.status == "done", run.error
        result = Result.model_validate(run.summary)
        assert result.engine is not None and result.ok == result.requests == n
        steps = result.engine.iteration_tokens
        assert result.engine.preemptions is not None and steps and steps.count is not None
        tries.append((result.engine.preemptions, steps.count))
        assert steps.count >= 0.98 * stats.steps, tries  # (fewer steps than the burst needs)
        if steps.count <= 1.05 * stats.steps:
            break
    measured, count = tries[-1]
    why = f"(preemptions, steps) of each try: {tries}; simulated {stats.preemptions}, {stats.steps}"
    assert count <= 1.05 * stats.steps, f"the burst never reached the scheduler whole: {why}"
    assert abs(measured - stats.preemptions) <= 0.25 * stats.preemptions, why
