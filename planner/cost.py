"""The reserve-vs-violation frame: what headroom costs against what breaking the SLO costs.

cost of reserve = price per GPU-hour x reserve GPUs x hours; cost of violation = share of
requests outside the SLO x requests x cost per violation. The share at each reserve level
comes from measurements or the queueing model, and its source label travels with it. The
degradation ladder says how much KV capacity each cheaper way of answering frees.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner.capacity import CapacityPlan, PlanRequest, plan_capacity
from planner.errors import InvalidInput
from planner.models import ModelArch
from planner.queueing import queue_estimate

DEFAULT_RESERVES = (0, 1, 2, 3, 4)


def _finite(value: float, what: str, minimum: float = 0.0, strict: bool = False) -> float:
    bad = math.isnan(value) or math.isinf(value) or value < minimum
    if bad or (strict and value == minimum):
        op = ">" if strict else ">="
        raise InvalidInput(f"{what} must be a number {op} {minimum:g}, got {value}")
    return value


def _reserves(reserves: Sequence[int]) -> tuple[int, ...]:
    out = tuple(sorted(set(reserves)))
    if not out:
        raise InvalidInput("give at least one reserve level")
    if out[0] < 0:
        raise InvalidInput(f"reserve levels are extra replicas, 0 or more; got {out[0]}")
    return out


# ---------------------------------------------------------------------------------------
# The share outside the SLO at each reserve level
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareTable:
    """Share of requests outside the SLO per reserve level, labelled with where it came from."""

    reserves: tuple[int, ...]
    shares: tuple[float, ...]
    source: str
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.reserves) != len(self.shares):
            raise InvalidInput("one share outside the SLO per reserve level")
        _reserves(self.reserves)
        if len(set(self.reserves)) != len(self.reserves):
            raise InvalidInput("each reserve level once")
        for s in self.shares:
            if math.isnan(s) or not 0 <= s <= 1:
                raise InvalidInput(f"a share outside the SLO is from 0 to 1, got {s}")
        if not self.source.strip():
            raise InvalidInput("say where the shares come from (e.g. 'measured', 'model')")

    def at(self, reserve: int) -> float:
        """The share at one reserve level (it must be in the table)."""
        try:
            return self.shares[self.reserves.index(reserve)]
        except ValueError:
            raise InvalidInput(f"no share for reserve {reserve}; have {self.reserves}") from None


def share_table(
    shares: Mapping[int, float] | Callable[[int], float],
    source: str,
    reserves: Sequence[int] = DEFAULT_RESERVES,
) -> ShareTable:
    """A ShareTable from a {reserve: share} table or a function of the reserve level."""
    if isinstance(shares, Mapping):
        levels = _reserves(list(shares))
        values = tuple(float(shares[r]) for r in levels)
    else:
        levels = _reserves(reserves)
        values = tuple(float(shares(r)) for r in levels)
    return ShareTable(levels, values, source)


def _base(arrival_rate: float, base_replicas: int) -> None:
    _finite(arrival_rate, "arrival rate (requests/s)", strict=True)
    if base_replicas < 1:
        raise InvalidInput(f"base replicas must be at least 1, got {base_replicas}")


def share_outside_from_queueing(
    arrival_rate: float,
    replica_rate: float,
    base_replicas: int,
    wait_budget_s: float,
    reserves: Sequence[int] = DEFAULT_RESERVES,
    ca: float = 1.0,
    cs: float = 1.0,
    slots_per_replica: int = 1,
    pooled: bool = True,
) -> ShareTable:
    """Model the share outside the SLO as the share waiting longer than `wait_budget_s`.

    `replica_rate`: requests/s one replica completes at saturation (from capacity);
    `wait_budget_s`: queueing a request can absorb (TTFT bound minus unloaded TTFT). Each
    replica is `slots_per_replica` servers of service time slots / replica_rate; `pooled`
    puts all replicas behind one queue (a perfect router), else each replica gets an even
    random split of traffic. Allen–Cunneen mean wait, exponential tail: a rough model of the
    TTFT side only; TPOT growing under load is not modelled. ρ >= 1 counts as all outside.
    """
    _base(arrival_rate, base_replicas)
    _finite(replica_rate, "replica service rate (requests/s)", strict=True)
    _finite(wait_budget_s, "wait budget (s)")
    if slots_per_replica < 1:
        raise InvalidInput(f"slots per replica must be at least 1, got {slots_per_replica}")
    levels = _reserves(reserves)
    service_s = slots_per_replica / replica_rate
    shares: list[float] = []
    overloaded: list[int] = []
    for r in levels:
        n = base_replicas + r
        rho = arrival_rate / (n * replica_rate)
        if rho >= 1:
            overloaded.append(r)
            shares.append(1.0)
            continue
        if pooled:
            queue = queue_estimate(arrival_rate, service_s, n * slots_per_replica, ca, cs)
        else:
            # Splitting a renewal stream at random with probability p: ca'² = p·ca² + 1 - p.
            p = 1 / n
            ca_split = math.sqrt(p * ca * ca + 1 - p)
            queue = queue_estimate(arrival_rate * p, service_s, slots_per_replica, ca_split, cs)
        shares.append(queue.share_waiting_longer(wait_budget_s))
    notes = [
        f"queueing model ({'one pooled queue' if pooled else 'random split per replica'}, "
        f"Allen–Cunneen, exponential tail), ca={ca:g}, cs={cs:g}: a rough guide"
    ]
    if overloaded:
        notes.append(
            "utilisation >= 1 at reserve "
            + ", ".join(map(str, overloaded))
            + ": the queue grows without bound, every request counted outside"
        )
    return ShareTable(levels, tuple(shares), "model: queueing", tuple(notes))


def share_outside_from_measurements(
    points: Sequence[tuple[float, float]],
    arrival_rate: float,
    base_replicas: int,
    reserves: Sequence[int] = DEFAULT_RESERVES,
    source: str = "measured",
) -> ShareTable:
    """Interpolate measured (rate per replica, share outside) points at each reserve's load.

    Load per replica at reserve r is arrival_rate / (base + r); between points the share is
    linear, outside the measured rates it is held at the nearest point (and noted).
    """
    _base(arrival_rate, base_replicas)
    if not points:
        raise InvalidInput("give at least one measured (rate per replica, share outside) point")
    for rate, share in points:
        _finite(rate, "measured rate per replica (requests/s)")
        if math.isnan(share) or not 0 <= share <= 1:
            raise InvalidInput(f"a measured share outside the SLO is from 0 to 1, got {share}")
    pts = sorted(points)
    rates = np.array([p[0] for p in pts], dtype=float)
    if len(set(rates.tolist())) != len(rates):
        raise InvalidInput("two measurements at the same rate; average them first")
    values = np.array([p[1] for p in pts], dtype=float)
    levels = _reserves(reserves)
    loads = np.array([arrival_rate / (base_replicas + r) for r in levels])
    shares = np.interp(loads, rates, values)
    notes = []
    above = [r for r, x in zip(levels, loads, strict=True) if x > rates[-1]]
    below = [r for r, x in zip(levels, loads, strict=True) if x < rates[0]]
    if above:
        notes.append(
            f"reserve {', '.join(map(str, above))}: load per replica above the highest "
            f"measured rate ({rates[-1]:g}/s); the share there is likely worse than shown"
        )
    if below:
        notes.append(
            f"reserve {', '.join(map(str, below))}: load per replica below the lowest "
            f"measured rate ({rates[0]:g}/s); held at that point's share"
        )
    return ShareTable(levels, tuple(float(s) for s in shares), source, tuple(notes))


# ---------------------------------------------------------------------------------------
# The cost frame
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CostInputs:
    """What the user enters: prices, the deployment's shape and the traffic."""

    price_per_gpu_hour: float
    gpus_per_replica: int
    hours: float
    requests_per_hour: float
    cost_per_violation: float

    def __post_init__(self) -> None:
        _finite(self.price_per_gpu_hour, "price per GPU-hour")
        _finite(self.hours, "hours", strict=True)
        _finite(self.requests_per_hour, "requests per hour")
        _finite(self.cost_per_violation, "cost per violation")
        if self.gpus_per_replica < 1:
            raise InvalidInput(f"GPUs per replica must be at least 1, got {self.gpus_per_replica}")


def cost_of_reserve(price_per_gpu_hour: float, reserve_gpus: int, hours: float) -> float:
    """price per GPU-hour x reserve GPUs x hours."""
    return price_per_gpu_hour * reserve_gpus * hours


def cost_of_violation(share_outside: float, requests: float, cost_per_violation: float) -> float:
    """share of requests outside the SLO x requests x cost per violation."""
    return share_outside * requests * cost_per_violation


@dataclass(frozen=True, slots=True)
class CostRow:
    """One reserve level: its GPUs, the share outside, and both costs."""

    reserve: int
    reserve_gpus: int
    share_outside: float
    violations: float
    cost_of_reserve: float
    cost_of_violation: float
    total: float
    is_minimum: bool = False


@dataclass(frozen=True, slots=True)
class CostFrame:
    """Total cost per reserve level with the cheapest marked; `source` is the share's label."""

    inputs: CostInputs
    rows: tuple[CostRow, ...]
    best: CostRow
    source: str
    notes: tuple[str, ...] = ()


def cost_frame(inputs: CostInputs, shares: ShareTable) -> CostFrame:
    """Cost of reserve, cost of violation and their total at each level; ties go to less."""
    requests = inputs.requests_per_hour * inputs.hours
    rows = []
    for reserve, share in zip(shares.reserves, shares.shares, strict=True):
        gpus = reserve * inputs.gpus_per_replica
        reserve_cost = cost_of_reserve(inputs.price_per_gpu_hour, gpus, inputs.hours)
        violation_cost = cost_of_violation(share, requests, inputs.cost_per_violation)
        rows.append(
            CostRow(
                reserve=reserve,
                reserve_gpus=gpus,
                share_outside=share,
                violations=share * requests,
                cost_of_reserve=reserve_cost,
                cost_of_violation=violation_cost,
                total=reserve_cost + violation_cost,
            )
        )
    best_index = min(range(len(rows)), key=lambda i: (rows[i].total, rows[i].reserve))
    rows[best_index] = replace(rows[best_index], is_minimum=True)
    return CostFrame(
        inputs=inputs,
        rows=tuple(rows),
        best=rows[best_index],
        source=shares.source,
        notes=shares.notes,
    )


@dataclass(frozen=True, slots=True)
class ColdStart:
    """Why a reserve must already be running: a replica started when a surge comes serves
    nobody for its whole cold start, and the requests it was started for wait or miss."""

    cold_start_s: float
    surges: float
    violations_per_surge: float
    violations: float
    cost_on_demand: float
    cost_one_reserve: float


def cold_start_cost(
    inputs: CostInputs, base_replicas: int, cold_start_s: float, surges_per_hour: float
) -> ColdStart:
    """Scaling on demand against one replica kept in reserve, over `inputs.hours`.

    Each surge needs one more replica; started then, for `cold_start_s` the load it was
    meant to take (one replica's share of the traffic) is not served in time and counts as
    outside the SLO. A rough, labelled model: bigger surges cost more."""
    _finite(cold_start_s, "cold start (s)")
    _finite(surges_per_hour, "surges per hour")
    if base_replicas < 1:
        raise InvalidInput(f"the base load needs at least one replica, got {base_replicas}")
    per_replica_rps = inputs.requests_per_hour / 3600 / base_replicas
    per_surge = per_replica_rps * cold_start_s
    surges = surges_per_hour * inputs.hours
    violations = per_surge * surges
    return ColdStart(
        cold_start_s=cold_start_s,
        surges=surges,
        violations_per_surge=per_surge,
        violations=violations,
        cost_on_demand=violations * inputs.cost_per_violation,
        cost_one_reserve=cost_of_reserve(
            inputs.price_per_gpu_hour, inputs.gpus_per_replica, inputs.hours
        ),
    )


@dataclass(frozen=True, slots=True)
class RetryLoad:
    """How much load a retry policy puts on a service whose requests fail at some share."""

    failure_share: float
    max_retries: int
    attempts_unbounded: float  # attempts per request with every retry taken
    attempts: float  # with the retry budget applied, if one is
    budget: float | None
    budget_binds: bool


def retry_amplification(
    failure_share: float, max_retries: int, budget: float | None = None
) -> RetryLoad:
    """Attempts per request when each attempt fails independently with `failure_share`
    and a client retries up to `max_retries` times: 1 + p + ... + p^r. A retry budget
    (retries at most `budget` x first attempts, the seed's advice, with backoff and jitter)
    caps it at 1 + budget, however high failures climb: an overloaded service that fails
    more is not also sent more."""
    if math.isnan(failure_share) or not 0 <= failure_share <= 1:
        raise InvalidInput(f"failure share is from 0 to 1, got {failure_share}")
    if max_retries < 0:
        raise InvalidInput(f"retries must be 0 or more, got {max_retries}")
    if budget is not None and (math.isnan(budget) or budget < 0):
        raise InvalidInput(f"a retry budget is a share of requests, 0 or more, got {budget}")
    p = failure_share
    unbounded = float(max_retries + 1) if p == 1 else (1 - p ** (max_retries + 1)) / (1 - p)
    attempts = unbounded if budget is None else min(unbounded, 1 + budget)
    return RetryLoad(
        failure_share=p,
        max_retries=max_retries,
        attempts_unbounded=unbounded,
        attempts=attempts,
        budget=budget,
        budget_binds=budget is not None and unbounded > 1 + budget,
    )


# ---------------------------------------------------------------------------------------
# The degradation ladder
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Degradation:
    """One cheaper way to answer: fewer tokens, another model, or traffic moved to batch."""

    name: str
    output_factor: float = 1.0
    output_tokens_removed: int = 0
    prompt_tokens_removed: int = 0
    model: ModelArch | None = None
    tp: int | None = None
    deferred_share: float = 0.0

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise InvalidInput("a degradation step needs a name")
        if math.isnan(self.output_factor) or not 0 < self.output_factor <= 1:
            raise InvalidInput(
                f"output factor shortens answers: from 0 (exclusive) to 1, got {self.output_factor}"
            )
        if self.output_tokens_removed < 0 or self.prompt_tokens_removed < 0:
            raise InvalidInput("tokens removed must be 0 or more")
        if math.isnan(self.deferred_share) or not 0 <= self.deferred_share < 1:
            raise InvalidInput(
                f"deferred share is the traffic moved to batch, from 0 to below 1; "
                f"got {self.deferred_share}"
            )


def shorter_answers(factor: float, name: str = "shorter answers") -> Degradation:
    """Cap answers at `factor` of today's output tokens (e.g. 0.5)."""
    return Degradation(name, output_factor=factor)


def smaller_model(model: ModelArch, tp: int | None = None, name: str = "") -> Degradation:
    """Serve another architecture on the same GPUs (tp None: all of them as one replica)."""
    return Degradation(name or f"smaller model: {model.name}", model=model, tp=tp)


def no_reasoning(reasoning_tokens: int, name: str = "no reasoning") -> Degradation:
    """Drop the thinking tokens from each answer."""
    return Degradation(name, output_tokens_removed=reasoning_tokens)


def fewer_chunks(chunks: int, tokens_per_chunk: int, name: str = "") -> Degradation:
    """Retrieve `chunks` fewer passages of `tokens_per_chunk` tokens each."""
    if chunks < 0 or tokens_per_chunk < 0:
        raise InvalidInput("chunks and tokens per chunk must be 0 or more")
    return Degradation(
        name or f"{chunks} fewer retrieved chunks", prompt_tokens_removed=chunks * tokens_per_chunk
    )


def deferred_queue(share: float, name: str = "deferred queue") -> Degradation:
    """Move `share` of the interactive traffic to a batch queue served later."""
    return Degradation(name, deferred_share=share)


@dataclass(frozen=True, slots=True)
class LadderStep:
    """Capacity before and after one step (applied on top of the steps above it).

    Concurrency is sequences the deployment's KV cache holds at once at the request's
    context (vLLM's max concurrency x replicas, capped at max_num_seqs per replica).
    `freed_share` is the share of the capacity the interactive traffic needed before the
    step that it no longer needs; `freed_total` the same against the base.
    """

    name: str
    concurrency_before: float
    concurrency_after: float
    freed_share: float
    how: str
    freed_total: float
    prompt_tokens: int
    output_tokens: int
    traffic_share: float


def _concurrency(plan: CapacityPlan, what: str) -> tuple[float, bool]:
    if plan.max_concurrency <= 0:
        raise InvalidInput(
            f"{what}: {plan.request.model.name} leaves no KV cache for a {plan.context:,}-token "
            "request on these GPUs"
        )
    cap = plan.max_num_seqs
    capped = plan.max_concurrency > cap
    return min(plan.max_concurrency, cap) * plan.replicas, capped


def _plan(base: PlanRequest, model: ModelArch, tp: int | None, context: int) -> CapacityPlan:
    max_len = base.max_model_len
    if max_len is not None:
        max_len = min(max_len, model.max_position_embeddings)
    return plan_capacity(
        replace(base, model=model, tp=tp, context=context, max_model_len=max_len, batch=1)
    )


def ladder(
    base_request: PlanRequest,
    steps: Sequence[Degradation],
    *,
    prompt_tokens: int,
    output_tokens: int,
) -> list[LadderStep]:
    """Walk down the ladder: each step's capacity effect on top of the ones before it.

    The base request gives model, GPUs and dtypes; its context is replaced by
    prompt_tokens + output_tokens. Capacity comes from `plan_capacity` at each context.
    """
    if prompt_tokens < 1 or output_tokens < 1:
        raise InvalidInput("a request has at least 1 prompt token and 1 output token")
    model, tp = base_request.model, base_request.tp
    prompt, output, traffic = prompt_tokens, output_tokens, 1.0
    plan = _plan(base_request, model, tp, prompt + output)
    conc, _ = _concurrency(plan, "base")
    base_demand = traffic / conc
    out: list[LadderStep] = []
    for step in steps:
        new_prompt = prompt - step.prompt_tokens_removed
        new_output = math.floor(output * step.output_factor) - step.output_tokens_removed
        if new_prompt < 1:
            raise InvalidInput(
                f"{step.name}: removes {step.prompt_tokens_removed} prompt tokens of {prompt}"
            )
        if new_output < 1:
            raise InvalidInput(f"{step.name}: leaves no output tokens (of {output})")
        new_model = step.model or model
        new_tp = step.tp if step.model is not None else tp
        new_traffic = traffic * (1 - step.deferred_share)
        new_plan = _plan(base_request, new_model, new_tp, new_prompt + new_output)
        new_conc, capped = _concurrency(new_plan, step.name)
        before, after = traffic / conc, new_traffic / new_conc
        parts = []
        if new_model is not model:
            parts.append(
                f"model {model.name} -> {new_model.name} "
                f"(tp {new_plan.tp}, {new_plan.replicas} replica{'s' * (new_plan.replicas > 1)})"
            )
        if (new_prompt, new_output) != (prompt, output):
            parts.append(
                f"context {prompt + output:,} -> {new_prompt + new_output:,} tokens "
                f"(prompt {prompt:,} -> {new_prompt:,}, output {output:,} -> {new_output:,})"
            )
        if step.deferred_share:
            parts.append(f"{step.deferred_share:.0%} of the interactive traffic moved to batch")
        if capped:
            parts.append(
                f"capped at max_num_seqs={new_plan.max_num_seqs} per replica: "
                "the KV cache is no longer the limit"
            )
        out.append(
            LadderStep(
                name=step.name,
                concurrency_before=conc,
                concurrency_after=new_conc,
                freed_share=1 - after / before,
                how="; ".join(parts) or "no change",
                freed_total=1 - after / base_demand,
                prompt_tokens=new_prompt,
                output_tokens=new_output,
                traffic_share=new_traffic,
            )
        )
        model, tp, prompt, output, traffic = new_model, new_tp, new_prompt, new_output, new_traffic
        conc = new_conc
    return out
