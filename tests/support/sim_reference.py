"""The simulator's scheduler as first written: one Python object per request, every step
a walk over the running requests. Slow and plain; the vectorised engine must give the same
results."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from planner.errors import InvalidInput
from planner.simulate.engine import EngineConfig, EngineStats, RequestResult, SimRequest, StepCost


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


def _cap(config: EngineConfig) -> int:
    """Most prefill tokens one request takes in a step."""
    threshold = config.long_prefill_token_threshold
    if threshold > 0 and config.chunked_prefill:
        return threshold
    return config.max_num_batched_tokens


def _blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


def reference_simulate(
    requests: Iterable[SimRequest],
    config: EngineConfig,
    cost: StepCost,
    stats: EngineStats | None = None,
    sample_every_s: float | None = None,
) -> Iterator[RequestResult]:
    """Run the traffic (ordered by arrival) through the engine; yield each request's result
    as it finishes or is refused. `stats` collects totals (and a timeline of KV blocks in
    use and queue depth every `sample_every_s` of simulated time)."""
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
    # A session's turns wait for the one before to end: sessions with a turn in the engine,
    # the turns held behind it, and the turns let go (arrival, order, request).
    busy: dict[str, list[SimRequest]] = {}
    released: list[tuple[float, int, SimRequest]] = []
    # With prefix caching, a preempted request's full blocks stay cached while they are
    # free (oldest chain first, its last blocks first, when blocks are needed): found
    # again if it is readmitted before they are taken.
    parked: OrderedDict[_Seq, int] = OrderedDict()
    order = itertools.count()

    def next_arrival() -> tuple[SimRequest | None, bool]:
        """The next arrival, and whether it is a turn let go."""
        if released and (pending is None or released[0][0] <= pending.arrival_s):
            return released[0][2], True
        return pending, False

    def ended(req: SimRequest) -> None:
        if req.session is None:
            return
        held = busy[req.session]
        if not held:
            del busy[req.session]
            return
        turn = held.pop(0)
        turn = replace(turn, arrival_s=max(turn.arrival_s, now))
        heapq.heappush(released, (turn.arrival_s, next(order), turn))

    def take_arrivals() -> Iterator[RequestResult]:
        nonlocal pending, last_arrival
        while True:
            req, let_go = next_arrival()
            if req is None or req.arrival_s > now:
                return
            if let_go:
                heapq.heappop(released)
            else:
                if req.arrival_s < last_arrival:
                    raise InvalidInput("requests must be ordered by arrival time")
                last_arrival = req.arrival_s
                pending = next(arrivals, None)
                if req.session is not None:
                    if req.session in busy:
                        busy[req.session].append(req)
                        continue
                    busy[req.session] = []
            if req.prompt_tokens + req.output_tokens > config.max_model_len:
                stats.refused += 1
                yield RequestResult(req, refused=True)
                ended(req)
            elif req.prompt_tokens < 1 or req.output_tokens < 1:
                raise InvalidInput("a request needs at least one prompt and one output token")
            else:
                waiting.append(_Seq(req))

    def evict(blocks: int) -> None:
        """Free `blocks` of parked ones (or all there are): the oldest chain's last first."""
        nonlocal free
        while blocks > 0 and parked:
            seq = next(iter(parked))
            take = min(parked[seq], blocks)
            parked[seq] -= take
            if not parked[seq]:
                del parked[seq]
            free += take
            blocks -= take

    def preempt(victim: _Seq) -> None:
        nonlocal free
        running.remove(victim)
        victim.alive = False
        full = victim.computed // config.block_size if config.prefix_caching else 0
        free += victim.blocks - full
        if full:
            parked[victim] = full
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
            if parked:
                evict(need - free)
                continue
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
        if done and busy:
            yield from take_arrivals()  # turns due in the step are held before these end
        if done:
            running[:] = [q for q in running if q.generated < q.req.output_tokens]
        for q in done:
            q.alive = False
            free += q.blocks
            yield _result(q, now)
            ended(q.req)
        if sample_every_s is not None and now >= next_sample:
            used = config.num_blocks - free - sum(parked.values())
            stats.timeline.append((now, used, len(waiting)))
            next_sample = now + sample_every_s

    while pending is not None or released or waiting or running:
        yield from take_arrivals()
        if not waiting and not running:
            upcoming, _ = next_arrival()
            now = upcoming.arrival_s if upcoming is not None else now
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
            bs = config.block_size
            tokens = seq.req.prompt_tokens + seq.generated
            hit = min(parked.get(seq, 0), (tokens - 1) // bs)  # its own blocks, if left
            room = free + sum(parked.values()) - hit
            want = tokens - hit * bs
            if want > budget and not config.chunked_prefill:
                break
            if config.reserve_full_prompt and _blocks_for(tokens, bs) - hit > room:
                break
            want = min(want, budget, _cap(config))
            need = _blocks_for(hit * bs + want, bs) - hit
            if need > room:
                break
            waiting.popleft()
            free += parked.pop(seq, 0) - hit
            if need > free:
                evict(need - free)
            free -= need
            seq.blocks, seq.computed = hit + need, hit * bs
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
            upcoming, _ = next_arrival()
            if upcoming is None:
                raise InvalidInput(
                    "the KV cache cannot hold one request: raise num_blocks or lower max_model_len"
                )
            now = max(now, upcoming.arrival_s)
            continue
        tokens = sum(n for _, n in scheduled)
        kv_tokens = sum(s.computed + n for s, n in scheduled)
        pairs = sum(n * s.computed + n * (n + 1) // 2 for s, n in scheduled)
        step = cost.step_s(tokens, kv_tokens, len(scheduled), pairs)
        now += step
        stats.steps += 1
        stats.tokens += tokens
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
