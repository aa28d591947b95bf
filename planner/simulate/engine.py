"""vLLM V1's scheduler, step by step, in simulated time.

Each step has a token budget (`max_num_batched_tokens`) and at most `max_num_seqs`
requests. Running requests are served first, in arrival order: a decode takes one token, a
prefill in progress its next chunk. Waiting requests are admitted in arrival order while the
budget, the sequence limit and the free KV blocks allow: with chunked prefill a prompt may
take what is left of the budget, without it a prompt is admitted whole or not at all. KV
blocks of `block_size` tokens are allocated as tokens are computed; when a running request
needs a block and none is free, the newest running request is preempted (its blocks freed,
recomputed from scratch later) and counted. A request longer than `max_model_len` is
refused. The step's duration comes from a `StepCost`; the step that completes a prompt
emits the first token, each decode step one more.

Pure and deterministic; memory grows with the requests in flight, not with all of them
(finished requests are handed to the caller as they finish).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from planner.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine settings the scheduler obeys; `num_blocks` is the planner's usable count."""

    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    max_model_len: int = 8192
    # vLLM's --long-prefill-token-threshold: a prefill takes at most this many tokens a
    # step (0: no limit), leaving the rest of the budget to other requests.
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{name} must be at least 1, got {getattr(self, name)}")
        if _blocks_for(self.max_model_len, self.block_size) > self.num_blocks:
            raise InvalidInput(
                f"one {self.max_model_len:,}-token request needs more than the "
                f"{self.num_blocks:,} KV blocks: vLLM refuses to start; lower max_model_len"
            )
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise InvalidInput(
                "without chunked prefill max_num_batched_tokens must be at least "
                f"max_model_len ({self.max_num_batched_tokens} < {self.max_model_len}), as "
                "vLLM requires"
            )


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds per engine step: a fixed overhead plus the slower of reading memory (the
    weights once, the KV of every token attended) and computing (per token scheduled)."""

    overhead_s: float
    weights_read_s: float
    kv_token_read_s: float
    token_compute_s: float

    def step_s(self, tokens: int, kv_tokens: int) -> float:
        """One step that schedules `tokens` and attends over `kv_tokens` cached tokens."""
        memory = self.weights_read_s + kv_tokens * self.kv_token_read_s
        return self.overhead_s + max(memory, tokens * self.token_compute_s)


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of the traffic: when it arrives, its lengths and its class."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cls: str = ""


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one request saw: times from its arrival, in seconds (None when refused)."""

    request: SimRequest
    refused: bool
    queue_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    itl_max_s: float | None = None
    preemptions: int = 0


@dataclass(slots=True, eq=False)  # identity: two equal requests are two sequences
class _Seq:
    req: SimRequest
    computed: int = 0  # tokens whose KV is cached (prompt, then generated)
    generated: int = 0
    blocks: int = 0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    itl_max_s: float = 0.0
    preemptions: int = 0
    order: int = 0  # admission order: the newest is preempted first
    alive: bool = False  # running now (cleared when preempted or finished)

    @property
    def prompt_left(self) -> int:
        return max(self.req.prompt_tokens + self.generated - self.computed, 0)


@dataclass(slots=True)
class EngineStats:
    """Totals over a run."""

    steps: int = 0
    preemptions: int = 0
    refused: int = 0
    busy_s: float = 0.0
    # (time, KV blocks in use, requests waiting), one row per step when sampling is asked
    timeline: list[tuple[float, int, int]] = field(default_factory=list)


def _cap(config: EngineConfig) -> int:
    """Most prefill tokens one request takes in a step."""
    threshold = config.long_prefill_token_threshold
    if threshold > 0 and config.chunked_prefill:
        return threshold
    return config.max_num_batched_tokens


def _blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


def _decode_span(running: list[_Seq], free: int, config: EngineConfig, limit: int) -> int:
    """How many decode-only steps all of `running` can take before one needs a KV block
    that is not free (at most `limit`): each sequence needs its next block when its last
    one fills, then one every block_size tokens."""
    bs = config.block_size
    room = [s.blocks * bs - s.computed for s in running]  # tokens left in held blocks

    def need(k: int) -> int:
        return sum(-(-(k - r) // bs) for r in room if k > r)

    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def simulate(
    requests: Iterable[SimRequest],
    config: EngineConfig,
    cost: StepCost,
    stats: EngineStats | None = None,
    sample_every_s: float | None = None,
    fast_forward: bool = True,
) -> Iterator[RequestResult]:
    """Run the traffic (ordered by arrival) through the engine; yield each request's result
    as it finishes or is refused. `stats` collects totals (and a timeline of KV blocks in
    use and queue depth every `sample_every_s` of simulated time). `fast_forward` runs
    stretches of decode-only steps (no prompt in progress, no admission possible, blocks
    free) in one go: the same results, far fewer Python operations."""
    stats = stats if stats is not None else EngineStats()
    arrivals = iter(requests)
    pending: SimRequest | None = next(arrivals, None)
    waiting: deque[_Seq] = deque()
    running: list[_Seq] = []
    free = config.num_blocks
    now = 0.0
    admitted = 0
    next_sample = 0.0
    last_arrival = -math.inf

    def take_arrivals() -> Iterator[RequestResult]:
        nonlocal pending, last_arrival
        while pending is not None and pending.arrival_s <= now:
            if pending.arrival_s < last_arrival:
                raise InvalidInput("requests must be ordered by arrival time")
            last_arrival = pending.arrival_s
            if pending.prompt_tokens + pending.output_tokens > config.max_model_len:
                stats.refused += 1
                yield RequestResult(pending, refused=True)
            elif pending.prompt_tokens < 1 or pending.output_tokens < 1:
                raise InvalidInput("a request needs at least one prompt and one output token")
            else:
                waiting.append(_Seq(pending))
            pending = next(arrivals, None)

    def preempt(victim: _Seq) -> None:
        nonlocal free
        running.remove(victim)
        victim.alive = False
        free += victim.blocks
        victim.blocks, victim.computed = 0, 0
        victim.preemptions += 1
        stats.preemptions += 1
        waiting.appendleft(victim)

    def grow(seq: _Seq, tokens: int) -> bool:
        """Blocks for `tokens` more tokens of `seq`, preempting newer requests if needed;
        False when `seq` itself had to go."""
        nonlocal free
        need = _blocks_for(seq.computed + tokens, config.block_size) - seq.blocks
        while need > free:
            victim = running[-1]  # admission order: the newest is last
            preempt(victim)
            if victim is seq:
                return False
        free -= max(need, 0)
        seq.blocks += max(need, 0)
        return True

    def end_of_step() -> Iterator[RequestResult]:
        """Hand over the requests the step finished, free their blocks, sample."""
        nonlocal free, next_sample
        done = [q for q in running if q.generated >= q.req.output_tokens]
        if done:
            running[:] = [q for q in running if q.generated < q.req.output_tokens]
        for q in done:
            q.alive = False
            free += q.blocks
            yield _result(q, now)
        if sample_every_s is not None and now >= next_sample:
            stats.timeline.append((now, config.num_blocks - free, len(waiting)))
            next_sample = now + sample_every_s

    while pending is not None or waiting or running:
        yield from take_arrivals()
        if not waiting and not running:
            now = pending.arrival_s if pending is not None else now
            continue
        admit = bool(waiting) and len(running) < config.max_num_seqs
        if (
            fast_forward
            and running
            and not admit
            and len(running) <= config.max_num_batched_tokens
            and all(not q.prompt_left for q in running)
        ):
            n = len(running)
            left = min(q.req.output_tokens - q.generated for q in running)
            k = _decode_span(running, free, config, left)
            if k > 1:
                kv = sum(q.computed for q in running)
                # An arrival that could be admitted ends the stretch at the step it sees.
                arrival = (
                    pending.arrival_s
                    if pending is not None and n < config.max_num_seqs
                    else math.inf
                )
                worst = 0.0
                for j in range(k):
                    if j and now >= arrival:
                        k = j
                        break
                    step = cost.step_s(n, kv + n * (j + 1))
                    now += step
                    worst = max(worst, step)
                    stats.busy_s += step
                stats.steps += k
                for q in running:
                    need = _blocks_for(q.computed + k, config.block_size) - q.blocks
                    free -= need
                    q.blocks += need
                    q.computed += k
                    q.generated += k
                    q.itl_max_s = max(q.itl_max_s, worst)
                    q.last_token_s = now
                yield from end_of_step()
                continue
        budget = config.max_num_batched_tokens
        before = stats.preemptions
        scheduled: list[tuple[_Seq, int]] = []
        # `running` is in admission order: readmitted requests rejoin at the end.
        for seq in list(running):
            if not seq.alive or budget == 0:
                continue
            want = min(seq.prompt_left, budget, _cap(config)) if seq.prompt_left else 1
            if not grow(seq, want):
                continue
            scheduled.append((seq, want))
            budget -= want
        scheduled = [(s, n) for s, n in scheduled if s.alive]
        # As vLLM V1: no new admissions in a step that had to preempt.
        while (
            stats.preemptions == before
            and waiting
            and budget > 0
            and len(running) < config.max_num_seqs
        ):
            seq = waiting[0]
            want = seq.prompt_left
            if want > budget and not config.chunked_prefill:
                break
            want = min(want, budget, _cap(config))
            need = _blocks_for(want, config.block_size)
            if need > free:
                break
            waiting.popleft()
            free -= need
            seq.blocks = need
            admitted += 1
            seq.order = admitted
            seq.alive = True
            if seq.scheduled_s is None:
                seq.scheduled_s = now
            running.append(seq)
            scheduled.append((seq, want))
            budget -= want
        if not scheduled:
            # Nothing fits (every block held by prompts in progress): wait for an arrival.
            if pending is None:
                raise InvalidInput(
                    "the KV cache cannot hold one request: raise num_blocks or lower max_model_len"
                )
            now = max(now, pending.arrival_s)
            continue
        tokens = sum(n for _, n in scheduled)
        kv_tokens = sum(s.computed + n for s, n in scheduled)
        step = cost.step_s(tokens, kv_tokens)
        now += step
        stats.steps += 1
        stats.busy_s += step
        for seq, n in scheduled:
            seq.computed += n
            if seq.prompt_left:
                continue  # a prompt chunk: no token yet
            seq.generated += 1
            if seq.first_token_s is None:
                seq.first_token_s = now
            elif seq.last_token_s is not None:
                seq.itl_max_s = max(seq.itl_max_s, now - seq.last_token_s)
            seq.last_token_s = now
        yield from end_of_step()


def _result(seq: _Seq, now: float) -> RequestResult:
    req = seq.req
    assert seq.first_token_s is not None and seq.scheduled_s is not None
    decodes = req.output_tokens - 1
    return RequestResult(
        request=req,
        refused=False,
        queue_s=seq.scheduled_s - req.arrival_s,
        ttft_s=seq.first_token_s - req.arrival_s,
        e2e_s=now - req.arrival_s,
        tpot_s=(now - seq.first_token_s) / decodes if decodes else None,
        itl_max_s=seq.itl_max_s if decodes else None,
        preemptions=seq.preemptions,
    )


def merge_by_arrival(*streams: Iterable[SimRequest]) -> Iterator[SimRequest]:
    """Several arrival-ordered streams as one."""
    key: Callable[[SimRequest], float] = lambda r: r.arrival_s  # noqa: E731
    return heapq.merge(*streams, key=key)
