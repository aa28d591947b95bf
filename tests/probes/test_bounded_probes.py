"""Bounded probes: limits refused at the edge with one line, an in-flight cap that records
misses instead of running away, schedules and prompts made as the run goes, a cancel
honoured within 2 s by every kind, deadlines that end a run as timed out, and an OOM probe
that waits for a crashed engine to come back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from planner.errors import Cancelled, InvalidInput
from planner.workload import Arrival, FixedProfile, parse_profile
from probes.engine.spec import EngineSpec, embedded_spec
from probes.kinds import KINDS, StoredRun, execute, get_kind, parse_params
from probes.kinds.context import (
    PROMPT_TOKENS_AHEAD,
    PROMPTS_AHEAD,
    PROMPTS_AHEAD_MIN,
    ProbeContext,
    prompt_window,
)
from probes.load.generator import (
    Bounds,
    RequestResult,
    RequestSpec,
    new_client,
    run_open_loop,
)
from probes.load.workloads import REFILL
from probes.vllm.client import AsyncVllmClient, Endpoint, Target
from storage import queries as q
from storage.schemas import ProbeLimits
from storage.settings import Settings
from tests.support.cli import kvscope
from tests.support.fake_openai import FakeConfig, serve

LIMITS = ProbeLimits(max_rate=100, max_duration_s=600, max_requests=5000, max_in_flight=64)


@pytest.mark.parametrize(
    ("kind", "data", "words"),
    [
        ("latency", {"rate": 500}, "500 req/s rate, over the limit of 100"),
        ("latency", {"rate": 10, "duration_s": 3600}, "over the limit of 600"),
        ("latency", {"rate": 50, "duration_s": 500}, "25,000 planned requests"),
        ("batch_sweep", {"concurrencies": [128]}, "128 requests in flight, over the limit of 64"),
        ("oom", {"confirm": True, "batch": 100, "max_steps": 4}, "requests in flight"),
        ("capacity", {"ttft_slo_s": 1, "tpot_slo_s": 0.1, "max_rate": 1000}, "MAX_RATE"),
    ],
)
def test_limits_are_refused_at_the_edge_with_one_line(
    kind: str, data: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidInput, match="KVSCOPE_PROBE_LIMITS__") as err:
        parse_params(kind, data, limits=LIMITS)
    assert words in str(err.value) and "\n" not in str(err.value)
    parse_params(kind, data)  # the same without limits: the checks are the limits'


def test_the_cli_refuses_an_unbounded_probe_before_sending(tmp_path: Path) -> None:
    with serve(FakeConfig()) as fake:
        res = kvscope(
            "probe", "latency", "--target", fake.url, "--rate", "10000", "--duration", "86400",
            env_dir=tmp_path, environ={"KVSCOPE_PROBE_LIMITS__MAX_RATE": "100"},
        )  # fmt: skip
        assert res.returncode == 2
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the latency probe asks for 10,000 req/s rate")
        assert fake.generations == 0


def test_an_open_loop_over_its_in_flight_cap_records_misses(tmp_path: Path) -> None:
    async def go(url: str) -> Any:
        async with new_client() as http:
            specs = [RequestSpec("hello there", 50) for _ in range(40)]
            return await run_open_loop(
                http,
                Endpoint(url, "tiny-llama"),
                specs,
                [0.0] * 40,  # all at once
                bounds=Bounds(max_in_flight=10),
            )

    with serve(FakeConfig(itl_s=0.02)) as fake:
        result = asyncio.run(go(fake.url))
    missed = [r for r in result.records if r.sent_ts is None]
    assert len(missed) == 30 and fake.generations == 10
    assert all("the in-flight limit" in (r.error or "") for r in missed)
    s = result.summary()
    assert s.errors == 30 and s.ok == 10  # misses count, never hidden


def test_a_long_schedule_is_made_as_the_run_goes() -> None:
    """A run of more requests than fit a prompt window gets its send times and prompts as it
    goes, and hands its records on in batches instead of keeping them. Its whole first
    window is built before its clock starts, and the rest a few at a time as they are used:
    counting prompts with the target during the run is load on it."""
    batches: list[Sequence[RequestResult]] = []
    window = 256

    async def go(url: str) -> Any:
        async with new_client() as http:
            vllm = AsyncVllmClient(Target(url), http)
            ctx = ProbeContext(
                vllm, "tiny-llama", sink=lambda recs, step: batches.append(recs),
                prompts_ahead=window,
            )  # fmt: skip
            params = parse_params("latency", {"rate": 400, "duration_s": 5, "prompt_tokens": 8})
            profile = params.workload()  # type: ignore[attr-defined]
            arrivals = Arrival(kind="constant", rate=400)
            specs, schedule = await ctx.workload(profile, arrivals, 5, 0)
            assert not isinstance(specs, list) and not isinstance(schedule, list)
            return await ctx.open_loop(params, "latency", specs, schedule, planned=2000)

    with serve(FakeConfig(keep_bodies=True)) as fake:
        result = asyncio.run(go(fake.url))
    assert result.records == []  # not kept: they went to the sink as the run went
    assert sum(map(len, batches)) == result.tally.requests == 2000
    assert len(batches) > 2  # in batches, during the run
    assert result.planned == 2000 and result.tally.ok == 2000
    # Every prompt was built (by the stand-in's tokenizer) and none twice.
    assert len({b["prompt"] for b in fake.bodies}) == 2000
    first_send = fake.sent[0][0]
    before = [t for t in fake.tokenized if t < first_send]
    assert len(before) >= window  # the whole window, before the first send
    # No counting while the first sends use the window: it starts again once REFILL went.
    assert not [t for t in fake.tokenized if first_send <= t < fake.sent[REFILL // 2][0]]
    first = min((r for batch in batches for r in batch), key=lambda r: r.seq)
    # The first request went out on time, not after the window was built.
    assert (first.lateness_s or 0.0) < (before[-1] - before[0]) / 2


def test_the_prompt_window_holds_a_budget_of_tokens() -> None:
    """Short prompts: a window of PROMPTS_AHEAD (a 40-s run at 43 req/s is built whole
    before it starts); long ones fewer, so its text stays within the token budget; never
    fewer than PROMPTS_AHEAD_MIN."""

    def window(prompt: int, most: int = PROMPTS_AHEAD) -> int:
        return prompt_window(FixedProfile(prompt_tokens=prompt, output_tokens=8), 0, most)

    assert window(256) == PROMPTS_AHEAD >= 43 * 40
    assert window(2_000) == PROMPT_TOKENS_AHEAD // 2_000 < PROMPTS_AHEAD
    assert window(100_000) == PROMPTS_AHEAD_MIN
    assert window(256, most=100) == 100
    mix = parse_profile("code-review")
    drawn = mix.shapes(PROMPTS_AHEAD_MIN, 3)
    mean = sum(d.prompt_tokens for d in drawn) / len(drawn)
    assert prompt_window(mix, 3, 10**6) == int(PROMPT_TOKENS_AHEAD / mean)


def _quick(kind: str) -> dict[str, Any]:
    quick: dict[str, dict[str, Any]] = {
        "latency": {"rate": 5, "duration_s": 60, "prompt_tokens": 16, "output_tokens": 4},
        "batch_sweep": {"concurrencies": [1, 2, 4, 8], "requests_per_step": 400},
        "oom": {"confirm": True, "batch": 2, "start_context": 256, "step": 64, "max_steps": 100},
        "kv_usage": {"rate": 5, "duration_s": 60, "baseline_s": 30, "prompt_tokens": 32},
        "capacity": {"ttft_slo_s": 5, "tpot_slo_s": 1, "duration_s": 60, "start_rate": 2},
        "ab": {"confirm": True, "a": {"max_num_seqs": 2}, "b": {"max_num_seqs": 4}, "rate": 5,
               "duration_s": 60, "prompt_tokens": 16, "output_tokens": 4},
    }  # fmt: skip
    return quick[kind]


def _engine(kind: str, settings: Settings) -> dict[str, Any]:
    """What a kind that restarts the engine is given by the worker: its spec, a restart."""
    if kind != "ab":
        return {}

    async def restart(spec: EngineSpec) -> None:
        await asyncio.sleep(0.1)

    return {"spec": embedded_spec(settings), "restart": restart}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_honours_a_cancel_within_two_seconds(
    store: Engine, settings: Settings, kind: str
) -> None:
    params = parse_params(kind, _quick(kind))
    run = q.start_run(store, kind, params.model_dump())
    runner = StoredRun(store, run.id)
    with serve(FakeConfig(itl_s=0.02, metrics=True, max_model_len=100_000)) as fake:
        cancelled_at: list[float] = []

        def cancel_soon() -> None:
            time.sleep(3.0)
            q.cancel_run(store, run.id)
            cancelled_at.append(time.monotonic())

        threading.Thread(target=cancel_soon, daemon=True).start()
        try:
            probe = get_kind(kind)
            extra = _engine(kind, settings)
            cancelled = runner.run(probe, params, Target(fake.url), managed=True, **extra).cancelled
        except Cancelled:  # between steps a probe stops with what it had stored
            cancelled = True
        took = time.monotonic() - cancelled_at[0]
    assert cancelled
    assert took < 2.0, took


def test_the_oom_probe_waits_for_a_crashed_engine_before_its_next_step() -> None:
    from probes.kinds.oom import Result as OomResult

    params = parse_params(
        "oom",
        {"confirm": True, "batch": 2, "start_context": 256, "step": 256, "max_steps": 2}
        | {"search": "bisect", "output_tokens": 4, "bisect_granularity": 64},
    )
    config = FakeConfig(metrics=True, crash_over_tokens=300, down_s=1.5)
    with serve(config) as fake:
        result = asyncio.run(execute(get_kind("oom"), params, Target(fake.url), managed=True))
    assert isinstance(result, OomResult)
    assert result.failure is not None and result.failure.kind == "engine_crashed"
    assert len(fake.crashes) >= 2  # the step past 300 tokens, and bisection steps
    for crashed in fake.crashes:
        (size,) = {p for t, p in fake.sent if t == crashed}
        # No next step was sent while the engine was down: the probe waited for it. (The
        # crashing step's other request may reach the fake a little after, on a busy machine.)
        later = [t for t, p in fake.sent if t > crashed and p != size]
        assert not later or min(later) >= crashed + config.down_s
    assert result.health_after in ("healthy", "restarted")
    assert result.last_good_context is not None and 256 <= result.last_good_context < 320


def test_a_run_past_its_deadline_ends_timed_out(store: Engine, settings: Any) -> None:
    from probes.worker import Worker

    with serve(FakeConfig(itl_s=0.05)) as fake:
        w = Worker(settings)
        tid = q.add_target(w.store, q.parse_target({"name": "t", "base_url": fake.url})).id
        run = q.request_run(
            w.store, "latency", {"rate": 2, "duration_s": 60, "prompt_tokens": 8}, tid
        )
        w.work.pick_up()
        item = w.work._active[run.id]
        item.deadline = time.monotonic() + 2.0
        end = time.monotonic() + 30
        while time.monotonic() < end and q.get_run(w.store, run.id).status == "running":
            w.work.pick_up()
            time.sleep(0.2)
        done = q.get_run(w.store, run.id)
    assert done.status == "timed_out", (done.status, done.error)
    assert "ran past its deadline" in (done.error or "") and done.summary  # measured: kept
    assert done.deadline_at is not None


def test_deadlines_follow_what_a_run_asks(settings: Any) -> None:
    from probes.worker import Worker

    w = Worker(settings)
    run = q.request_run(w.store, "latency", {"rate": 1, "duration_s": 100})
    assert 100 < w.work.deadline_s(run) <= settings.probe_limits.max_run_s
    check = q.request_run(w.store, "check_target")
    assert w.work.deadline_s(check) == settings.scrape.deadline_s + 10.0
