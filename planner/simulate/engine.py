"""vLLM V1's scheduler, step by step, in simulated time.

Each step has a token budget (`max_num_batched_tokens`) and at most `max_num_seqs` requests.
Running requests are served first, in admission order: a decode takes one token, a prefill
in progress its next chunk. Waiting requests are admitted in arrival order while the budget,
the sequence limit and the free KV blocks allow: with chunked prefill a prompt may take what
is left of the budget, without it a prompt is admitted whole or not at all. KV blocks of
`block_size` tokens are allocated as tokens are computed; when a running request needs a
block and none is free, the newest running request is preempted (its blocks freed,
recomputed from scratch later) and counted. A request longer than `max_model_len` is
refused. The step's duration comes from a `StepCost`; the step that completes a prompt
emits the first token, each decode step one more.

The running set lives in numpy arrays (one step costs a few array operations whatever the
batch), and stretches of decode-only steps run in one go. Pure and deterministic; memory
grows with the requests in flight, not with all of them (finished requests are handed to
the caller as they finish).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

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
    # vLLM's scheduler_reserve_full_isl (on by default in 0.32): a waiting request is
    # admitted only when its whole prompt fits in the free blocks, even if its first chunk
    # would; without it, chunked prefill over-admits and preempts.
    reserve_full_prompt: bool = True

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

    @property
    def prefill_cap(self) -> int:
        """Most prefill tokens one request takes in a step."""
        threshold = self.long_prefill_token_threshold
        if threshold > 0 and self.chunked_prefill:
            return threshold
        return self.max_num_batched_tokens


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds per engine step: a fixed overhead plus the slower of reading memory (the
    weights once, the KV of every token attended) and computing (per token scheduled), or
    with `additive` their sum (a calibrated fit: on a CPU, neither hides the other); plus a
    cost per sequence scheduled (sampling, detokenising, streaming its token) and per
    attention pair (a query token against a cached one: a long prefill's quadratic part)."""

    overhead_s: float
    weights_read_s: float
    kv_token_read_s: float
    token_compute_s: float
    additive: bool = False
    seq_s: float = 0.0
    pair_s: float = 0.0

    def step_s(self, tokens: int, kv_tokens: int, seqs: int = 0, pairs: int = 0) -> float:
        """One step that schedules `tokens` of `seqs` sequences, attends over `kv_tokens`
        cached tokens, `pairs` query-key pairs in all."""
        memory = self.weights_read_s + kv_tokens * self.kv_token_read_s
        compute = tokens * self.token_compute_s
        step = self.overhead_s + (memory + compute if self.additive else max(memory, compute))
        return step + seqs * self.seq_s + pairs * self.pair_s

    def decode_steps_s(self, seqs: int, kv_tokens: int, steps: int) -> np.ndarray:
        """`steps` decode steps of `seqs` sequences attending over `kv_tokens` cached tokens
        before the first (each step adds one per sequence): `step_s` of each, as an array
        (a decode's pairs are its context)."""
        kv = kv_tokens + seqs * np.arange(1, steps + 1, dtype=np.int64)
        memory = self.weights_read_s + kv * self.kv_token_read_s
        compute = seqs * self.token_compute_s
        step: np.ndarray = self.overhead_s + (
            memory + compute if self.additive else np.maximum(memory, compute)
        )
        return step + seqs * self.seq_s + kv * self.pair_s


def pairs_of(chunk: int, cached: int) -> int:
    """Query-key pairs when `chunk` new tokens attend over `cached` ones and each other."""
    return chunk * cached + chunk * (chunk + 1) // 2


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


@dataclass(slots=True)
class EngineStats:
    """Totals over a run."""

    steps: int = 0
    preemptions: int = 0
    refused: int = 0
    busy_s: float = 0.0
    stretches: int = 0  # runs of decode-only steps taken in one go
    max_batch: int = 0  # most requests scheduled in one step
    # (time, KV blocks in use, requests waiting), one row per step when sampling is asked
    timeline: list[tuple[float, int, int]] = field(default_factory=list)


# Receives inter-token gaps in seconds and how many requests saw each one.
GapSink = Callable[[np.ndarray, float], None]


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass(slots=True, eq=False)
class _Waiting:
    """A request that is not running: new, or preempted (its progress and times kept)."""

    req: SimRequest
    generated: int = 0
    preemptions: int = 0
    scheduled_s: float = math.nan
    first_s: float = math.nan
    last_s: float = math.nan
    itl_max_s: float = 0.0

    @property
    def tokens(self) -> int:
        """Tokens to compute before its next token: the prompt and what it had generated."""
        return self.req.prompt_tokens + self.generated


class _Running:
    """The running requests as arrays, in admission order (the newest last): one 2-D array
    of integers and one of floats, so that dropping finished requests is two operations."""

    def __init__(self, capacity: int) -> None:
        self.n = 0
        self.reqs: list[SimRequest] = []
        self.ints = np.zeros((6, capacity), dtype=np.int64)
        self.floats = np.zeros((4, capacity))
        (
            self.prompt,
            self.output,
            self.generated,
            self.computed,
            self.blocks,
            self.preemptions,
        ) = self.ints  # rows: views that stay valid
        self.scheduled_s, self.first_s, self.last_s, self.itl_max_s = self.floats

    def add(self, w: _Waiting, now: float) -> None:
        i = self.n
        self.reqs.append(w.req)
        self.prompt[i], self.output[i] = w.req.prompt_tokens, w.req.output_tokens
        self.generated[i], self.computed[i], self.blocks[i] = w.generated, 0, 0
        self.preemptions[i] = w.preemptions
        self.scheduled_s[i] = now if math.isnan(w.scheduled_s) else w.scheduled_s
        self.first_s[i], self.last_s[i], self.itl_max_s[i] = w.first_s, w.last_s, w.itl_max_s
        self.n += 1

    def pop(self) -> tuple[_Waiting, int]:
        """Take out the newest: its state as a waiting request, and the blocks it held."""
        self.n -= 1
        i = self.n
        w = _Waiting(
            self.reqs.pop(),
            int(self.generated[i]),
            int(self.preemptions[i]) + 1,
            float(self.scheduled_s[i]),
            float(self.first_s[i]),
            float(self.last_s[i]),
            float(self.itl_max_s[i]),
        )
        return w, int(self.blocks[i])

    def keep(self, mask: np.ndarray) -> None:
        """Keep the requests where `mask` holds, in order."""
        n, m = self.n, int(mask.sum())
        self.ints[:, :m] = self.ints[:, :n][:, mask]
        self.floats[:, :m] = self.floats[:, :n][:, mask]
        self.reqs = [r for r, k in zip(self.reqs, mask.tolist(), strict=True) if k]
        self.n = m

    def left(self) -> np.ndarray:
        """Tokens each must compute before its next token (1 for a decode)."""
        n = self.n
        return self.prompt[:n] + self.generated[:n] - self.computed[:n]


class _Engine:
    """One run's state; `run` drives it."""

    def __init__(
        self,
        requests: Iterable[SimRequest],
        config: EngineConfig,
        cost: StepCost,
        stats: EngineStats,
        sample_every_s: float | None,
        on_gaps: GapSink | None = None,
    ) -> None:
        self.config, self.cost, self.stats = config, cost, stats
        self.on_gaps = on_gaps
        self.sample_every_s, self.next_sample = sample_every_s, 0.0
        self.arrivals = iter(requests)
        self.pending: SimRequest | None = next(self.arrivals, None)
        self.last_arrival = -math.inf
        self.waiting: deque[_Waiting] = deque()
        self.running = _Running(config.max_num_seqs)
        self.free = config.num_blocks
        self.now = 0.0
        self.decoding = False  # every running request decoding, its last token at `now`

    def run(self, fast_forward: bool) -> Iterator[RequestResult]:
        while self.pending is not None or self.waiting or self.running.n:
            yield from self.take_arrivals()
            if not self.waiting and not self.running.n:
                assert self.pending is not None
                self.now = self.pending.arrival_s
                continue
            if fast_forward and self.decode_stretch():
                yield from self.end_of_step()
                continue
            if not self.step():
                # Nothing fits (every block held by prompts in progress): wait for an arrival.
                if self.pending is None:
                    raise InvalidInput(
                        "the KV cache cannot hold one request: raise num_blocks or lower "
                        "max_model_len"
                    )
                self.now = max(self.now, self.pending.arrival_s)
                continue
            yield from self.end_of_step()

    def take_arrivals(self) -> Iterator[RequestResult]:
        config = self.config
        while (r := self.pending) is not None and r.arrival_s <= self.now:
            if r.arrival_s < self.last_arrival:
                raise InvalidInput("requests must be ordered by arrival time")
            self.last_arrival = r.arrival_s
            if r.prompt_tokens < 1 or r.output_tokens < 1:
                raise InvalidInput("a request needs at least one prompt and one output token")
            if r.prompt_tokens + r.output_tokens > config.max_model_len:
                self.stats.refused += 1
                yield RequestResult(r, refused=True)
            else:
                self.waiting.append(_Waiting(r))
            self.pending = next(self.arrivals, None)

    def first_chunk(self, w: _Waiting, budget: int) -> int:
        """Tokens the head of the queue would take now (0: it cannot be admitted)."""
        config, want = self.config, w.tokens
        if budget <= 0 or (want > budget and not config.chunked_prefill):
            return 0
        if config.reserve_full_prompt and _blocks_for(want, config.block_size) > self.free:
            return 0
        want = min(want, budget, config.prefill_cap)
        return want if _blocks_for(want, config.block_size) <= self.free else 0

    def step(self) -> bool:
        """One regular step; False when nothing could be scheduled."""
        config, run, stats = self.config, self.running, self.stats
        n0 = run.n
        got = np.zeros(config.max_num_seqs, dtype=np.int64)
        preempted = False
        if n0:
            if self.decoding and n0 <= config.max_num_batched_tokens:
                got[:n0] = 1
            else:
                want = np.minimum(run.left(), config.prefill_cap)
                before = np.cumsum(want) - want
                room = np.maximum(config.max_num_batched_tokens - before, 0)
                got[:n0] = np.minimum(room, want)
            preempted = self.allocate(got)
        budget = config.max_num_batched_tokens - int(got[: run.n].sum())
        # As vLLM V1: no new admissions in a step that had to preempt.
        while not preempted and self.waiting and run.n < config.max_num_seqs:
            chunk = self.first_chunk(self.waiting[0], budget)
            if not chunk:
                break
            need = _blocks_for(chunk, config.block_size)
            run.add(self.waiting.popleft(), self.now)
            self.free -= need
            run.blocks[run.n - 1] = need
            got[run.n - 1] = chunk
            budget -= chunk
        n = run.n
        got = got[:n]
        scheduled = got > 0
        if not scheduled.any():
            return False
        computed = run.computed[:n]
        tokens = int(got.sum())
        kv_tokens = int((computed + got)[scheduled].sum())
        pairs = int((got * computed + got * (got + 1) // 2).sum())
        step = self.cost.step_s(tokens, kv_tokens, int(scheduled.sum()), pairs)
        self.now += step
        stats.steps += 1
        stats.busy_s += step
        computed += got
        emit = scheduled & (computed == run.prompt[:n] + run.generated[:n])
        run.generated[:n] += emit
        first = emit & np.isnan(run.first_s[:n])
        again = emit & ~first & ~np.isnan(run.last_s[:n])
        run.first_s[:n][first] = self.now
        gaps = self.now - run.last_s[:n][again]
        itl = run.itl_max_s[:n]
        itl[again] = np.maximum(itl[again], gaps)
        if self.on_gaps is not None and gaps.size:
            self.on_gaps(gaps, 1.0)
        run.last_s[:n][emit] = self.now
        stats.max_batch = max(stats.max_batch, int(scheduled.sum()))
        # Every request emitted: all are decoding, and their last token came just now.
        self.decoding = bool(emit.all())
        return True

    def allocate(self, got: np.ndarray) -> bool:
        """Blocks for the tokens each running request was given, preempting the newest while
        one of them cannot have its share (in order, as the scheduler walks them); True when
        something was preempted."""
        run, bs = self.running, self.config.block_size
        preempted = False
        while run.n:
            n = run.n
            need = np.maximum(-(-(run.computed[:n] + got[:n]) // bs) - run.blocks[:n], 0)
            short = np.cumsum(need) > self.free
            if not short[-1]:
                self.free -= int(need.sum())
                run.blocks[:n] += need
                return preempted
            # The first request that cannot grow: the newest goes (maybe itself); retry.
            waiting, blocks = run.pop()
            got[run.n] = 0
            self.free += blocks
            self.waiting.appendleft(waiting)
            self.stats.preemptions += 1
            preempted = True
        return preempted

    def decode_stretch(self) -> bool:
        """Run several decode-only steps at once when nothing else can happen during them:
        every running request decoding, none finishing before the last, no admission
        possible (or the next arrival ends the stretch), the blocks they need free."""
        config, run = self.config, self.running
        n = run.n
        if not n or not self.decoding or n > config.max_num_batched_tokens:
            return False
        budget = config.max_num_batched_tokens - n
        arrival = math.inf
        if self.waiting:
            # Blocked now means blocked throughout: free blocks only shrink in the stretch.
            if n < config.max_num_seqs and self.first_chunk(self.waiting[0], budget):
                return False
        elif self.pending is not None and n < config.max_num_seqs:
            arrival = self.pending.arrival_s
        k = int((run.output[:n] - run.generated[:n]).min())
        k = self._span(k)
        if k < 2:
            return False
        steps = self.cost.decode_steps_s(n, int(run.computed[:n].sum()), k)
        # Sequential sums, so that the times are exactly those of step-by-step runs.
        times = np.cumsum(np.concatenate(([self.now], steps)))
        if arrival < math.inf:
            # The stretch ends at the first step that starts at or after the arrival.
            k = min(k, int(np.searchsorted(times[1:], arrival, side="left")) + 1)
        self.stats.busy_s += float(steps[:k].sum())
        self.stats.steps += k
        self.stats.stretches += 1
        self.now = float(times[k])
        # Every request emitted at the last step's end, so the gaps are the step times.
        gaps = np.diff(times[: k + 1])
        itl = run.itl_max_s[:n]
        np.maximum(itl, float(gaps.max()), out=itl)
        if self.on_gaps is not None:
            self.on_gaps(gaps, float(n))
        self.stats.max_batch = max(self.stats.max_batch, n)
        run.last_s[:n] = self.now
        need = self._blocks_needed(k)
        run.blocks[:n] += need
        run.generated[:n] += k
        run.computed[:n] += k
        self.free -= int(need.sum())
        return True

    def _blocks_needed(self, k: int) -> np.ndarray:
        """Blocks each running request needs to decode `k` more tokens."""
        run, bs = self.running, self.config.block_size
        n = run.n
        need: np.ndarray = np.maximum(-(-(run.computed[:n] + k) // bs) - run.blocks[:n], 0)
        return need

    def _span(self, limit: int) -> int:
        """Most decode steps (up to `limit`) whose blocks are free."""
        if int(self._blocks_needed(limit).sum()) <= self.free:
            return limit
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(self._blocks_needed(mid).sum()) <= self.free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def end_of_step(self) -> Iterator[RequestResult]:
        """Hand over the requests the step finished, free their blocks, sample."""
        run, n = self.running, self.running.n
        done = run.generated[:n] >= run.output[:n]
        if done.any():
            for i in np.flatnonzero(done).tolist():
                yield self.result(i)
            self.free += int(run.blocks[:n][done].sum())
            run.keep(~done)
        if self.sample_every_s is not None and self.now >= self.next_sample:
            used = self.config.num_blocks - self.free
            self.stats.timeline.append((self.now, used, len(self.waiting)))
            self.next_sample = self.now + self.sample_every_s

    def result(self, i: int) -> RequestResult:
        run, now = self.running, self.now
        req = run.reqs[i]
        first = float(run.first_s[i])
        decodes = req.output_tokens - 1
        return RequestResult(
            request=req,
            refused=False,
            queue_s=float(run.scheduled_s[i]) - req.arrival_s,
            ttft_s=first - req.arrival_s,
            e2e_s=now - req.arrival_s,
            tpot_s=(now - first) / decodes if decodes else None,
            itl_max_s=float(run.itl_max_s[i]) if decodes else None,
            preemptions=int(run.preemptions[i]),
        )


def simulate(
    requests: Iterable[SimRequest],
    config: EngineConfig,
    cost: StepCost,
    stats: EngineStats | None = None,
    sample_every_s: float | None = None,
    fast_forward: bool = True,
    itl: GapSink | None = None,
) -> Iterator[RequestResult]:
    """Run the traffic (ordered by arrival) through the engine; yield each request's result
    as it finishes or is refused. `stats` collects totals (and a timeline of KV blocks in
    use and queue depth every `sample_every_s` of simulated time). `fast_forward` runs
    stretches of decode-only steps in one go: the same results, far fewer operations.
    `itl` receives every inter-token gap (an array of gaps, and how many requests saw each)
    as steps end, for a sketch of the ITL distribution."""
    engine = _Engine(
        requests, config, cost, stats if stats is not None else EngineStats(), sample_every_s, itl
    )
    return engine.run(fast_forward)


def merge_by_arrival(*streams: Iterable[SimRequest]) -> Iterator[SimRequest]:
    """Several arrival-ordered streams as one."""
    key: Callable[[SimRequest], float] = lambda r: r.arrival_s  # noqa: E731
    return heapq.merge(*streams, key=key)
