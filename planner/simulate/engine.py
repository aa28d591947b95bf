"""vLLM V1's scheduler, step by step, in simulated time.

Each step has a token budget (`max_num_batched_tokens`) and at most `max_num_seqs` requests.
Running requests are served first, in admission order: a decode takes one token, a prefill
in progress its next chunk. Waiting requests are admitted in arrival order while the budget,
the sequence limit and the free KV blocks allow: with chunked prefill a prompt may take what
is left of the budget, without it a prompt is admitted whole or not at all. KV blocks of
`block_size` tokens are allocated as tokens are computed; when a running request needs a
block and none is free, the newest running request is preempted (its blocks freed,
recomputed later) and counted. A request longer than `max_model_len` is refused. With
prefix caching, a request whose first tokens another request under the same key computed
before (a shared system prompt, the earlier turns of a chat) starts with those full blocks
computed, shares them instead of holding its own copy, and publishes the blocks it
completes; cached blocks nobody runs with stay until the least recently used are evicted
for room, a chain's last blocks first. A preempted request's full blocks stay cached too,
so that, readmitted before they are taken, it recomputes only what was lost. The step's
duration comes from a `StepCost`; the step that completes a prompt emits the first token,
each decode step one more.

The running set lives in numpy arrays (one step costs a few array operations whatever the
batch), and stretches of decode-only steps run in one go. Pure and deterministic; memory
grows with the requests in flight, not with all of them (finished requests are handed to
the caller as they finish).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

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
    # vLLM's --enable-prefix-caching (on by default in V1).
    prefix_caching: bool = True

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


# The step token counts vLLM's CPU backend keeps matmul plans for (its oneDNN handlers'
# primitive cache, 32 per weight shape, most recently used kept).
SHAPE_PLANS = 32


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds per engine step: a fixed overhead plus the slower of reading memory (the
    weights once, the KV of every token attended) and computing (per token scheduled), or
    with `additive` their sum (a calibrated fit: on a CPU, neither hides the other); plus a
    cost per sequence scheduled (sampling, detokenising, streaming its token) and per
    attention pair (a query token against a cached one: a long prefill's quadratic part).
    `arrival_s`: engine time each request that arrives while a batch runs takes: on a
    shared host the API server and the client, taking a request in, take CPU from the
    engine's steps (past the knee the CPU engine's requests decoded 2-8 % slower while
    requests arrived than in the queue's drain after, the host's drift taken out: 0.5-1.2
    ms an arrival at 56-59 req/s), and a burst's requests each take theirs (the
    CPU engine's first token of a burst came about 1 ms later for each request that
    arrived just after it). The steps that follow pay it, each at most doubled (the
    arrivals share the engine's CPU, they do not stop the engine). 0 on a roofline; a
    calibration measures it (`arrival_cost`).
    `shape_s`: what a step pays when its token count is one the engine never ran, and
    `replan_s` when it ran it before but not among the `shape_plans` most recent counts.
    vLLM's CPU backend plans each linear layer's oneDNN matmul for one number of rows (the
    step's tokens) and keeps the plans of the last 32 numbers; oneDNN keeps the kernels it
    built behind them. A count never run builds them (the CPU engine: about 2-2.5 ms, a
    fifth of a lone short prompt's TTFT), one evicted plans again from built kernels (a
    fraction of that), one kept costs nothing: a mix of prompt lengths meets the first two
    at most prefills, one length never. 0 on a roofline (not measured on a GPU); a
    calibration measures both (`shape_cost`)."""

    overhead_s: float
    weights_read_s: float
    kv_token_read_s: float
    token_compute_s: float
    additive: bool = False
    seq_s: float = 0.0
    pair_s: float = 0.0
    arrival_s: float = 0.0
    shape_s: float = 0.0
    shape_plans: int = SHAPE_PLANS
    replan_s: float = 0.0

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
        kv = np.arange(kv_tokens + seqs, kv_tokens + seqs * steps + 1, seqs, dtype=np.int64)
        step: np.ndarray = kv * float(self.kv_token_read_s)  # (a cost given as int 0 too)
        step += self.weights_read_s  # memory
        compute = seqs * self.token_compute_s
        if self.additive:
            step += compute
        elif compute > step[0]:  # (memory only grows: bound by it from the first step, it is
            np.maximum(step, compute, out=step)  # the max throughout)
        step += self.overhead_s
        # In step_s's order; a zero term adds nothing (x + 0.0 is x), so it is skipped.
        if self.seq_s:
            step += seqs * self.seq_s
        if self.pair_s:
            step += kv * self.pair_s
        return step

    def scaled(self, k: float) -> StepCost:
        """Every step `k` times as long (a host `k` times as slow)."""
        return StepCost(
            self.overhead_s * k,
            self.weights_read_s * k,
            self.kv_token_read_s * k,
            self.token_compute_s * k,
            self.additive,
            self.seq_s * k,
            self.pair_s * k,
            self.arrival_s * k,
            self.shape_s * k,
            self.shape_plans,
            self.replan_s * k,
        )


# What a step's token count is to the engine's matmul plans (`MatmulPlans.use`).
KEPT, REPLANNED, NEW = 0, 1, 2


class MatmulPlans:
    """The step token counts an engine holds matmul plans for (`StepCost.shape_s`): the
    `kept` most recently run, and every count it ever ran (at most its token budget)."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.counts: OrderedDict[int, None] = OrderedDict()  # least recent first
        self.ever: set[int] = set()

    def peek(self, tokens: int) -> int:
        """What a step of `tokens` tokens would find: KEPT, REPLANNED or NEW."""
        if tokens in self.counts:
            return KEPT
        return REPLANNED if tokens in self.ever else NEW

    def use(self, tokens: int) -> int:
        """Run a step of `tokens` tokens: what it found (`peek`). Its count becomes the most
        recent; past `kept`, the least recent is dropped."""
        counts = self.counts
        if tokens in counts:
            counts.move_to_end(tokens)
            return KEPT
        counts[tokens] = None
        if len(counts) > self.kept:
            counts.popitem(last=False)
        if tokens in self.ever:
            return REPLANNED
        self.ever.add(tokens)
        return NEW


# The window a calibration measures the host's speed over (a few seconds: a shared
# machine's speed moves from one to the next).
SPEED_WINDOW_S = 5.0


@dataclass(frozen=True, slots=True)
class HostSpeed:
    """A shared host's speed over time: a step that starts in the i-th window of `window_s`
    seconds takes `factors[i]` times its cost (the factors over again past the last). On a
    machine the engine shares, the same steps run a fifth faster or slower from one few
    seconds to the next; near the knee that moves the queue more than any step's cost."""

    window_s: float
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.window_s <= 0 or not self.factors or min(self.factors) <= 0:
            raise InvalidInput("a host speed needs a window above 0 s and factors above 0")


def pairs_of(chunk: int, cached: int) -> int:
    """Query-key pairs when `chunk` new tokens attend over `cached` ones and each other."""
    return chunk * cached + chunk * (chunk + 1) // 2


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of the traffic: when it arrives, its lengths and its class. `prefix`
    names what it shares with others: its first `prefix_tokens` are the same text as the
    first tokens of earlier requests under that key, and later ones may reuse its first
    `shares_tokens` (a system prompt: both its length; a chat turn: the earlier turns, and
    then its own prompt and answer). A request of a `session` is sent only once the
    session's previous one has ended, as a chat client (and the probes) send turns: its
    `arrival_s` is when it is due, and it arrives then or at that end, whichever is later."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cls: str = ""
    prefix: str | None = None
    prefix_tokens: int = 0
    shares_tokens: int = 0
    session: str | None = None


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
    tokens: int = 0  # computed in all: prompts, recomputed ones and decodes
    preemptions: int = 0
    refused: int = 0
    busy_s: float = 0.0
    stretches: int = 0  # runs of decode-only steps taken in one go
    max_batch: int = 0  # most requests scheduled in one step
    # Prompt tokens looked up in the prefix cache at a request's first admission, and those
    # found there (vLLM's prefix_cache_queries and prefix_cache_hits, which leave out
    # requests readmitted after a preemption).
    prefix_queries: int = 0
    prefix_hits: int = 0
    # (time, KV blocks in use, requests waiting), one row per step when sampling is asked
    timeline: list[tuple[float, int, int]] = field(default_factory=list)


# Receives inter-token gaps in seconds (an array the engine does not touch again) and how
# many requests saw each one.
GapSink = Callable[[np.ndarray, float], None]


# Reductions to Python numbers. Most arrays here are a few running requests long, and
# below _SHORT elements a list and the builtins take a fifth of numpy's reduction call.
_SHORT = 32
_add, _minimum, _maximum = np.add.reduce, np.minimum.reduce, np.maximum.reduce


def _isum(a: np.ndarray) -> int:
    return sum(a.tolist()) if a.size <= _SHORT else int(_add(a))


def _fsum(a: np.ndarray) -> float:
    return math.fsum(a.tolist()) if a.size <= _SHORT else float(_add(a))


def _imin(a: np.ndarray) -> int:
    return min(a.tolist()) if a.size <= _SHORT else int(_minimum(a))


def _fmax(a: np.ndarray) -> float:
    return max(a.tolist()) if a.size <= _SHORT else float(_maximum(a))


def _any(a: np.ndarray) -> bool:
    return any(a.tolist()) if a.size <= _SHORT else bool(np.logical_or.reduce(a))


def _all(a: np.ndarray) -> bool:
    return all(a.tolist()) if a.size <= _SHORT else bool(np.logical_and.reduce(a))


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
    # Preempted: the blocks it held under its key then (its own blocks, parked in the
    # prefix cache under this object, followed those).
    own_from: int = 0

    @property
    def tokens(self) -> int:
        """Tokens to compute before its next token: the prompt and what it had generated."""
        return self.req.prompt_tokens + self.generated


class _Running:
    """The running requests as arrays, in admission order (the newest last): one 2-D array
    of integers and one of floats, so that dropping finished requests is two operations.
    Between steps a request holds the KV blocks of what it computed and no more: `base` of
    them through the prefix cache, the rest alone (`alone`)."""

    def __init__(self, capacity: int, block_size: int) -> None:
        self.n = 0
        self.block_size = block_size
        self.reqs: list[SimRequest] = []
        self.ints = np.zeros((8, capacity), dtype=np.int64)
        self.floats = np.zeros((4, capacity))
        (
            self.prompt,
            self.output,
            self.generated,
            self.computed,
            self.preemptions,
            self.base,  # of its context, held by the prefix cache
            self.shares,  # tokens it may publish to the prefix cache
            self.published,  # blocks of those it has published
        ) = self.ints  # rows: views that stay valid
        self.progress = self.ints[2:4]  # generated and computed, which a decode moves together
        self.scheduled_s, self.first_s, self.last_s, self.itl_max_s = self.floats

    def add(self, w: _Waiting, now: float, hit: int = 0, cached: int = 0, shares: int = 0) -> None:
        """Run `w`, its first `cached` tokens (`hit` blocks) found in the prefix cache;
        `shares` tokens it may publish there."""
        i = self.n
        self.reqs.append(w.req)
        self.prompt[i], self.output[i] = w.req.prompt_tokens, w.req.output_tokens
        self.generated[i], self.computed[i] = w.generated, cached
        self.base[i], self.shares[i], self.published[i] = hit, shares, hit
        self.preemptions[i] = w.preemptions
        self.scheduled_s[i] = now if math.isnan(w.scheduled_s) else w.scheduled_s
        self.first_s[i], self.last_s[i], self.itl_max_s[i] = w.first_s, w.last_s, w.itl_max_s
        self.n += 1

    def pop(self) -> tuple[_Waiting, int, int]:
        """Take out the newest: its state as a waiting request, the blocks it held alone,
        and how many of those were full."""
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
            int(self.base[i]),
        )
        return w, self.alone(i), int(self.computed[i]) // self.block_size - int(self.base[i])

    def alone(self, i: int) -> int:
        """Blocks row `i` holds alone."""
        return _blocks_for(int(self.computed[i]), self.block_size) - int(self.base[i])

    def drop(self, rows: list[int]) -> None:
        """Drop these rows (ascending), keeping the others in order."""
        n = self.n
        if len(rows) == 1:  # the usual case: close the gap with two slice copies
            i = rows[0]
            self.ints[:, i : n - 1] = self.ints[:, i + 1 : n]
            self.floats[:, i : n - 1] = self.floats[:, i + 1 : n]
            del self.reqs[i]
            self.n = n - 1
            return
        keep = np.ones(n, dtype=bool)
        keep[rows] = False
        m = n - len(rows)
        self.ints[:, :m] = self.ints[:, :n][:, keep]
        self.floats[:, :m] = self.floats[:, :n][:, keep]
        gone = set(rows)
        self.reqs = [r for i, r in enumerate(self.reqs) if i not in gone]
        self.n = m

    def left(self) -> np.ndarray:
        """Tokens each must compute before its next token (1 for a decode)."""
        n = self.n
        return self.prompt[:n] + self.generated[:n] - self.computed[:n]


class _Phases:
    """How many running requests stand at each position of their last KV block, so that the
    blocks a run of decode steps needs is a count, not a pass over the requests. A request
    with c tokens computed has the key (c + offset) % block_size; a decode step moves every
    request on by one token and the offset back by one, so that no key changes. Stale after
    anything else moves them (a regular step); rebuilt when next asked."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.counts = [0] * block_size
        self.offset = 0
        self.n = 0
        self.stale = False

    def rebuild(self, computed: np.ndarray) -> None:
        keys = (computed + self.offset) % self.bs
        self.counts = np.bincount(keys, minlength=self.bs).tolist()
        self.n = len(computed)
        self.stale = False

    def add(self, computed: int) -> None:
        self.counts[(computed + self.offset) % self.bs] += 1
        self.n += 1

    def remove(self, computed: int) -> None:
        self.counts[(computed + self.offset) % self.bs] -= 1
        self.n -= 1

    def advance(self, tokens: int) -> None:
        """Every request computed `tokens` more."""
        self.offset = (self.offset - tokens) % self.bs

    def crossings(self, tokens: int) -> int:
        """Blocks the requests need to compute `tokens` more each: ((c - 1) % bs + tokens)
        // bs apiece, so `tokens // bs` each and one more for those whose (c - 1) % bs is
        at least bs - tokens % bs (their keys: a run of tokens % bs, around the end)."""
        bs, m = self.bs, tokens % self.bs
        total = self.n * (tokens // bs)
        if m:
            start = (bs - m + 1 + self.offset) % bs
            end = start + m
            counts = self.counts
            total += (
                sum(counts[start:end])
                if end <= bs
                else sum(counts[start:]) + sum(counts[: end - bs])
            )
        return total


class _PrefixCache:
    """Full KV blocks computed under each prefix key: pinned while a running request uses
    them, evictable when none does (the least recently used key first, its chain's last
    blocks first, as vLLM frees a request's blocks tail first). Blocks of one key are a
    chain: a request finds the first ones it has in common with it. A preempted request's
    own full blocks are parked here too, under the request, until it is readmitted."""

    def __init__(self) -> None:
        self.blocks: dict[object, int] = {}
        self.refs: dict[object, int] = {}
        self.idle: OrderedDict[object, None] = OrderedDict()  # unpinned keys, oldest first
        self.evictable = 0  # blocks of unpinned keys

    def room_for(self, key: str | None) -> int:
        """Blocks eviction could free if a request under `key` were admitted (its own key's
        blocks it would pin, not evict)."""
        if key is not None and key in self.idle:
            return self.evictable - self.blocks[key]
        return self.evictable

    def pin(self, key: str) -> None:
        refs = self.refs.get(key, 0)
        if not refs:
            if key in self.idle:
                del self.idle[key]
                self.evictable -= self.blocks[key]
            else:
                self.blocks.setdefault(key, 0)
        self.refs[key] = refs + 1

    def unpin(self, key: str) -> None:
        refs = self.refs[key] - 1
        if refs:
            self.refs[key] = refs
            return
        del self.refs[key]
        if self.blocks[key]:
            self.idle[key] = None
            self.evictable += self.blocks[key]
        else:
            del self.blocks[key]

    def evict(self, blocks: int) -> int:
        """Free `blocks`, or all that are evictable if fewer, from the oldest keys' chain
        ends; the blocks freed."""
        freed = 0
        while freed < blocks and self.idle:
            key = next(iter(self.idle))
            take = min(self.blocks[key], blocks - freed)
            freed += take
            if take == self.blocks[key]:
                del self.idle[key], self.blocks[key]
            else:
                self.blocks[key] -= take
        self.evictable -= freed
        return freed

    def park(self, key: object, blocks: int) -> None:
        """Keep an idle chain of `blocks` under `key` (a preempted request's own)."""
        self.blocks[key] = blocks
        self.idle[key] = None
        self.evictable += blocks

    def reclaim(self, key: object) -> int:
        """Take back what is left of a parked chain; its blocks."""
        if key not in self.idle:
            return 0
        del self.idle[key]
        blocks = self.blocks.pop(key)
        self.evictable -= blocks
        return blocks

    def grow(self, key: str, blocks: int) -> int:
        """Publish the first `blocks` of a pinned key's chain; how many were new (they move
        from the request that computed them to the cache)."""
        new = blocks - self.blocks[key]
        if new <= 0:
            return 0
        self.blocks[key] = blocks
        return new


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
        speed: HostSpeed | None = None,
    ) -> None:
        self.config, self.cost, self.stats = config, cost, stats
        self.speed = speed
        self.factor = 1.0  # the host's speed in the window `now` is in, which ends at:
        self.window_end = math.inf if speed is None else 0.0
        self.on_gaps = on_gaps
        self.sample_every_s, self.next_sample = sample_every_s, 0.0
        self.arrivals = iter(requests)
        self.upcoming: SimRequest | None = next(self.arrivals, None)  # the stream's next
        self.last_arrival = -math.inf
        # Sessions with a turn in the engine, and their later turns held until it ends; the
        # turns let go, as (arrival, order, request), earliest first.
        self.sessions: dict[str, deque[SimRequest]] = {}
        self.released: list[tuple[float, int, SimRequest]] = []
        self.order = 0
        self.pending = self.upcoming  # the next arrival, from the stream or let go
        self.waiting: deque[_Waiting] = deque()
        self.running = _Running(config.max_num_seqs, config.block_size)
        self.phases = _Phases(config.block_size)
        self.free = config.num_blocks  # held by nothing, cached by nothing
        self.cache = _PrefixCache() if config.prefix_caching else None
        self.now = 0.0
        self.debt = 0.0  # engine time arrivals took not yet paid by steps (StepCost.arrival_s)
        self.decoding = False  # every running request decoding, its last token at `now`
        # A request just joined an empty queue: the next step most likely admits it, so no
        # stretch is tried first (one would stop at once; a step is the same either way).
        self.fresh_head = False
        # The last step or stretch may have finished a request (a stretch cut short by an
        # arrival or by blocks has not).
        self.maybe_done = False
        # The token counts the engine holds matmul plans for, least recent first
        # (StepCost.shape_s); none tracked when planning costs nothing.
        planning = cost.shape_s or cost.replan_s
        self.plans = MatmulPlans(cost.shape_plans) if planning else None
        self.plan_s = (0.0, cost.replan_s, cost.shape_s)  # (by KEPT, REPLANNED, NEW)

    def run(self, fast_forward: bool) -> Iterator[RequestResult]:
        while self.pending is not None or self.waiting or self.running.n:
            yield from self.take_arrivals()
            if not self.waiting and not self.running.n:
                assert self.pending is not None
                self.now = self.pending.arrival_s
                self.debt = 0.0  # (paid while the engine idled)
                continue
            if self.now >= self.window_end:
                self.next_window()
            fresh, self.fresh_head = self.fresh_head, False
            if fast_forward and not fresh and self.decode_stretch():
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

    def charged(self, step_s: float) -> float:
        """How long a step that costs `step_s` lasts: with what it pays of the time arrivals
        took, at the host's speed in this window."""
        paid = min(self.debt, step_s)  # (at most doubled: see StepCost.arrival_s)
        self.debt -= paid
        return (step_s + paid) * self.factor

    def planned(self, tokens: int) -> float:
        """What a step of `tokens` tokens pays to plan its matmuls (StepCost.shape_s and
        replan_s): 0 when the engine holds a plan for that count; the count becomes the most
        recent."""
        return 0.0 if self.plans is None else self.plan_s[self.plans.use(tokens)]

    def next_window(self) -> None:
        """The host speed's window that `now` is in."""
        assert self.speed is not None
        i = int(self.now // self.speed.window_s)
        self.factor = self.speed.factors[i % len(self.speed.factors)]
        self.window_end = (i + 1) * self.speed.window_s

    def take_arrivals(self) -> Iterator[RequestResult]:
        config = self.config
        # Each arrival while a batch runs (an idle engine's steps lose nothing).
        per_arrival = self.cost.arrival_s if self.running.n else 0.0
        while (r := self.pending) is not None and r.arrival_s <= self.now:
            if self.released and self.released[0][2] is r:
                heapq.heappop(self.released)  # a held turn, its session's previous one over
            else:
                if r.arrival_s < self.last_arrival:
                    raise InvalidInput("requests must be ordered by arrival time")
                self.last_arrival = r.arrival_s
                self.upcoming = next(self.arrivals, None)
                if r.session is not None:
                    held = self.sessions.get(r.session)
                    if held is not None:  # its previous turn is still in the engine
                        held.append(r)
                        self.pending = self.earliest()
                        continue
                    self.sessions[r.session] = deque()
            self.pending = self.earliest()
            self.debt += per_arrival
            if r.prompt_tokens < 1 or r.output_tokens < 1:
                raise InvalidInput("a request needs at least one prompt and one output token")
            if r.prompt_tokens + r.output_tokens > config.max_model_len:
                self.stats.refused += 1
                yield RequestResult(r, refused=True)
                self.ended(r)
            else:
                self.fresh_head |= not self.waiting
                self.waiting.append(_Waiting(r))

    def earliest(self) -> SimRequest | None:
        """The next arrival: the stream's or a turn let go, whichever comes first."""
        if self.released and (
            self.upcoming is None or self.released[0][0] <= self.upcoming.arrival_s
        ):
            return self.released[0][2]
        return self.upcoming

    def ended(self, req: SimRequest) -> None:
        """`req` is over (answered or refused): its session's next turn, if one is held,
        arrives now (it was due earlier)."""
        if req.session is None:
            return
        held = self.sessions[req.session]
        if not held:
            del self.sessions[req.session]
            return
        turn = held.popleft()
        turn = replace(turn, arrival_s=max(turn.arrival_s, self.now))
        heapq.heappush(self.released, (turn.arrival_s, self.order, turn))
        self.order += 1
        self.pending = self.earliest()

    def hit(self, w: _Waiting) -> tuple[int, int]:
        """Blocks of `w`'s context the prefix cache holds (at least one token left to
        compute): under its key, and, readmitted after a preemption, of its own parked
        blocks, which it finds only if all it held under its key is still there."""
        cache = self.cache
        if cache is None:
            return 0, 0
        bs = self.config.block_size
        cap = (w.tokens - 1) // bs
        shared = 0
        if (key := w.req.prefix) is not None:
            reach = max(w.req.prefix_tokens // bs, w.own_from)
            shared = min(cache.blocks.get(key, 0), reach, cap)
        own = 0
        if w.preemptions and shared == w.own_from:
            own = min(cache.blocks.get(w, 0), cap - shared)
        return shared, own

    def first_chunk(self, w: _Waiting, budget: int) -> tuple[int, int, int]:
        """Tokens the head of the queue would compute now (0: it cannot be admitted), and
        the blocks of its context found in the prefix cache (`hit`: under its key, its own)."""
        config, bs = self.config, self.config.block_size
        shared, own = self.hit(w)
        hit = shared + own
        cached = hit * bs
        want = w.tokens - cached
        if budget <= 0 or (want > budget and not config.chunked_prefill):
            return 0, shared, own
        room = self.free
        if self.cache is not None:
            room += self.cache.room_for(w.req.prefix) - own  # (its own come back, not freed)
        if config.reserve_full_prompt and _blocks_for(w.tokens, bs) - hit > room:
            return 0, shared, own
        want = min(want, budget, config.prefill_cap)
        return (want if _blocks_for(cached + want, bs) - hit <= room else 0), shared, own

    def take(self, blocks: int) -> None:
        """Take `blocks` from the free ones, evicting cached blocks if they are short."""
        if blocks > self.free and self.cache is not None:
            self.free += self.cache.evict(blocks - self.free)
        self.free -= blocks
        assert self.free >= 0

    def step(self) -> bool:
        """One regular step; False when nothing could be scheduled."""
        config, run, stats = self.config, self.running, self.stats
        n0 = run.n
        self.maybe_done = True
        if self.decoding and 0 < n0 <= config.max_num_batched_tokens and self.decode_step():
            return True
        self.phases.stale = True  # (requests move on by different counts here)
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
        # As vLLM V1: no new admissions in a step that had to preempt.
        if not preempted:
            for i, _, chunk, _ in self.admit(config.max_num_batched_tokens - _isum(got[: run.n])):
                got[i] = chunk
        n = run.n
        got = got[:n]
        scheduled = got > 0
        if not _any(scheduled):
            return False
        computed = run.computed[:n]
        tokens = _isum(got)
        kv_tokens = _isum((computed + got)[scheduled])
        pairs = _isum(got * computed + got * (got + 1) // 2)
        step = self.cost.step_s(tokens, kv_tokens, _isum(scheduled), pairs)
        step = self.charged(step + self.planned(tokens))
        self.now += step
        stats.steps += 1
        stats.tokens += tokens
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
        self.publish()
        stats.max_batch = max(stats.max_batch, _isum(scheduled))
        # Every request emitted: all are decoding, and their last token came just now.
        self.decoding = _all(emit)
        return True

    def admit(self, budget: int) -> list[tuple[int, _Waiting, int, int]]:
        """Admit waiting requests in order while the budget, the sequence limit and the
        blocks allow; each one's row, its state as it waited, the tokens it computes this
        step and those it found cached."""
        config, run, stats = self.config, self.running, self.stats
        bs = config.block_size
        admitted: list[tuple[int, _Waiting, int, int]] = []
        while self.waiting and run.n < config.max_num_seqs:
            chunk, shared, own = self.first_chunk(self.waiting[0], budget)
            if not chunk:
                break
            w = self.waiting.popleft()
            cached = (shared + own) * bs
            shares = 0
            if self.cache is not None:
                if not w.preemptions:  # (vLLM counts a readmission apart, not in these)
                    stats.prefix_queries += w.tokens
                    stats.prefix_hits += cached
                if w.req.prefix is not None:
                    self.cache.pin(w.req.prefix)  # before taking, so it is not evicted
                    shares = w.req.shares_tokens
                if w.preemptions:
                    # Its own blocks back from the cache; any past the hit are free.
                    self.free += self.cache.reclaim(w) - own
            need = _blocks_for(cached + chunk, bs) - shared - own
            self.take(need)
            run.add(w, self.now, shared, cached, shares)
            admitted.append((run.n - 1, w, chunk, cached))
            budget -= chunk
        return admitted

    def decode_step(self) -> bool:
        """`step` when every running request is decoding and all of them get their blocks
        (False, with nothing changed but evictions, when one does not: the regular step
        preempts): the same arithmetic in fewer array operations, since every decode takes
        one token and emits it."""
        config, run, stats = self.config, self.running, self.stats
        n0 = run.n
        phases = self.fresh_phases()
        total = phases.crossings(1)
        if total > self.free and self.cache is not None:
            self.free += self.cache.evict(total - self.free)
        if total > self.free:
            return False
        self.free -= total
        computed = run.computed[:n0]
        context = _isum(computed)
        admitted = self.admit(config.max_num_batched_tokens - n0)
        # A decode attends over its context and itself; a prompt chunk over what it found
        # cached and itself.
        tokens, kv_tokens, pairs = n0, context + n0, context + n0
        for _, _, chunk, cached in admitted:
            tokens += chunk
            kv_tokens += cached + chunk
            pairs += pairs_of(chunk, cached)
        step = self.cost.step_s(tokens, kv_tokens, n0 + len(admitted), pairs)
        step = self.charged(step + self.planned(tokens))
        self.now += step
        now = self.now
        stats.steps += 1
        stats.tokens += tokens
        stats.busy_s += step
        run.progress[:, :n0] += 1  # generated and computed
        phases.advance(1)
        last = run.last_s[:n0]
        gaps = now - last
        itl = run.itl_max_s[:n0]
        np.maximum(itl, gaps, out=itl)
        last[:] = now
        decoding = True
        for i, w, chunk, cached in admitted:  # (w's values are the row's as admitted)
            run.computed[i] = cached + chunk
            phases.add(cached + chunk)
            if cached + chunk < w.tokens:
                decoding = False  # a chunk of a longer prompt: no token yet
                continue
            run.generated[i] = w.generated + 1
            if math.isnan(w.first_s):
                run.first_s[i] = now
            elif not math.isnan(w.last_s):  # readmitted after a preemption
                gap = now - w.last_s
                gaps = np.append(gaps, gap)
                run.itl_max_s[i] = max(w.itl_max_s, gap)
            run.last_s[i] = now
        if self.on_gaps is not None and gaps.size:
            self.on_gaps(gaps, 1.0)
        self.publish()
        stats.max_batch = max(stats.max_batch, n0 + len(admitted))
        self.decoding = decoding
        return True

    def allocate(self, got: np.ndarray) -> bool:
        """Blocks for the tokens each running request was given, preempting the newest while
        one of them cannot have its share (in order, as the scheduler walks them); True when
        something was preempted."""
        run, bs = self.running, self.config.block_size
        preempted = False
        while run.n:
            n = run.n
            computed = run.computed[:n]
            held = -(-computed // bs)  # (the blocks of what each computed: see _Running)
            total = _isum(-(-(computed + got[:n]) // bs) - held)
            if total > self.free and self.cache is not None:
                self.free += self.cache.evict(total - self.free)
            if total <= self.free:
                self.free -= total
                return preempted
            # The first request that cannot grow: the newest goes (maybe itself); retry.
            waiting, blocks, full = run.pop()
            got[run.n] = 0
            if self.cache is not None:
                # Its full blocks stay cached (freed, not wiped): found if it comes back
                # before they are taken.
                if full:
                    self.cache.park(waiting, full)
                    blocks -= full
                if waiting.req.prefix is not None:
                    self.cache.unpin(waiting.req.prefix)
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
        # A head of the queue it could admit now ends it before it starts (a blocked one
        # stays blocked throughout: free blocks only shrink in the stretch).
        if (
            self.waiting
            and n < config.max_num_seqs
            and self.first_chunk(self.waiting[0], budget)[0]
        ):
            return False
        # The next arrival ends it where it may be admitted (an empty queue, a free slot) or
        # where it costs the next step time.
        if self.pending is not None and (
            self.cost.arrival_s or (not self.waiting and n < config.max_num_seqs)
        ):
            arrival = self.pending.arrival_s
        # A new window of host speed ends it too (its steps cost what their window says).
        arrival = min(arrival, self.window_end)
        k = left = _imin(run.output[:n] - run.generated[:n])
        if k < 2:
            return False
        steps = self.cost.decode_steps_s(n, _isum(run.computed[:n]), k)
        if self.plans is not None:
            steps[0] += self.plan_s[self.plans.peek(n)]  # (the first step; `planned` if taken)
        if self.debt > steps[0]:
            return False  # (steps one by one pay it off: `charged`)
        steps[0] += self.debt  # (as `charged`: the debt, then the host's speed)
        if self.factor != 1:
            steps *= self.factor
        # Sequential sums, so that the times are exactly those of step-by-step runs.
        first = float(steps[0])
        steps[0] += self.now
        times = np.add.accumulate(steps)
        if arrival < math.inf:
            # The stretch ends at the first step that starts at or after the arrival.
            k = min(k, int(times.searchsorted(arrival, side="left")) + 1)
        # (A step's time does not depend on how many follow: the first k of these are the
        # stretch's, whatever its length.)
        k, total = self._span(k)
        if k < 2:
            return False
        self.maybe_done = k == left
        self.debt = 0.0
        self.planned(n)  # (its count the most recent, planned or not)
        steps[0] = first
        stats = self.stats
        stats.busy_s += _fsum(steps[:k])
        stats.steps += k
        stats.tokens += n * k
        stats.stretches += 1
        # Every request emitted at the last step's end, so the gaps are the step times.
        gaps = times[:k].copy()
        gaps[1:] -= times[: k - 1]
        gaps[0] -= self.now
        self.now = float(times[k - 1])
        itl = run.itl_max_s[:n]
        np.maximum(itl, _fmax(gaps), out=itl)
        if self.on_gaps is not None:
            self.on_gaps(gaps, float(n))
        stats.max_batch = max(stats.max_batch, n)
        run.last_s[:n] = self.now
        run.progress[:, :n] += k  # generated and computed
        self.phases.advance(k)
        self.free -= total
        self.publish()
        return True

    def publish(self) -> None:
        """Hand the full blocks running requests computed of what they share to the prefix
        cache (the blocks stay where they are; who holds them changes)."""
        cache, run = self.cache, self.running
        if cache is None or not cache.refs:
            return
        n = run.n
        ready = np.minimum(run.computed[:n], run.shares[:n]) // self.config.block_size
        for i in np.flatnonzero(ready > run.published[:n]).tolist():
            key = run.reqs[i].prefix
            assert key is not None
            run.base[i] += cache.grow(key, int(ready[i]))
            run.published[i] = ready[i]

    def fresh_phases(self) -> _Phases:
        """The running requests' phases, rebuilt if a regular step left them stale."""
        if self.phases.stale:
            self.phases.rebuild(self.running.computed[: self.running.n])
        return self.phases

    def _span(self, limit: int) -> tuple[int, int]:
        """Most decode steps (up to `limit`) whose blocks are free, and how many blocks."""
        phases = self.fresh_phases()
        total = phases.crossings(limit)
        if total <= self.free:
            return limit, total
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if phases.crossings(mid) <= self.free:
                lo = mid
            else:
                hi = mid - 1
        return lo, phases.crossings(lo)

    def end_of_step(self) -> Iterator[RequestResult]:
        """Hand over the requests the step finished, free their blocks, sample."""
        run, n = self.running, self.running.n
        done = run.generated[:n] >= run.output[:n] if self.maybe_done else None
        if done is not None and _any(done):
            if self.sessions:
                # Turns due during the step are held before the turns ahead of them end.
                yield from self.take_arrivals()
            rows = done.nonzero()[0].tolist()
            phases = self.phases
            for i in rows:
                yield self.result(i)
                self.ended(run.reqs[i])
                key = run.reqs[i].prefix
                if self.cache is not None and key is not None:
                    self.cache.unpin(key)
                self.free += run.alone(i)
                if not phases.stale:
                    phases.remove(int(run.computed[i]))
            run.drop(rows)
        if self.sample_every_s is not None and self.now >= self.next_sample:
            # As vLLM's KV usage: cached blocks nobody runs with count as free.
            idle = self.cache.evictable if self.cache is not None else 0
            used = self.config.num_blocks - self.free - idle
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
    speed: HostSpeed | None = None,
) -> Iterator[RequestResult]:
    """Run the traffic (ordered by arrival) through the engine; yield each request's result
    as it finishes or is refused. `stats` collects totals (and a timeline of KV blocks in
    use and queue depth every `sample_every_s` of simulated time). `fast_forward` runs
    stretches of decode-only steps in one go: the same results, far fewer operations.
    `itl` receives every inter-token gap (an array of gaps, and how many requests saw each)
    as steps end, for a sketch of the ITL distribution. `speed` slows and speeds the steps
    as a shared host does (none: every step costs what `cost` says)."""
    engine = _Engine(
        requests,
        config,
        cost,
        stats if stats is not None else EngineStats(),
        sample_every_s,
        itl,
        speed,
    )
    return engine.run(fast_forward)


def merge_by_arrival(*streams: Iterable[SimRequest]) -> Iterator[SimRequest]:
    """Several arrival-ordered streams as one."""
    key: Callable[[SimRequest], float] = lambda r: r.arrival_s  # noqa: E731
    return heapq.merge(*streams, key=key)
