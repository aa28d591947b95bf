"""What fits: tokens, sequences at a context, the OOM frontier, the smallest deployment.

`plan_capacity` takes a frozen `PlanRequest` (model, GPU, parallelism, dtypes, lengths) and
returns a `CapacityPlan` with vLLM's numbers (blocks, token capacity, max concurrency) and
the memory breakdown of the GPU that limits the cache. Curves and maps are vectorised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from planner.errors import InvalidInput
from planner.gpus import GPUSpec
from planner.kv import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    VLLM_KV_FLAG,
    KVGroup,
    blocks_per_request,
    blocks_per_request_array,
    default_block_size,
    group_size_on_stage,
    kv_bytes_per_token,
    kv_groups,
    num_blocks,
    page_bytes,
    pp_partition,
    resolve_kv_dtype,
    sequence_bytes,
    token_bytes_per_layer,
)
from planner.memory import DEFAULT_MAX_NUM_SEQS, MemoryBudget, memory_budget
from planner.models import (
    ModelArch,
    param_count,
    resolve_weight_dtype,
    served_dtype,
    stage_weight_bytes,
    weight_bytes,
)
from planner.overheads import AccountingChoice, accounting_for, default_batch_limits, overheads

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """Everything a capacity question needs; gpu=None means no device (explicit KV bytes)."""

    model: ModelArch
    gpu: GPUSpec | None = None
    num_gpus: int = 1
    tp: int | None = None
    pp: int = 1
    weights_dtype: str = "auto"
    model_dtype: str = "auto"
    kv_dtype: str = "auto"
    gpu_memory_utilization: float | None = None  # None: the release's default
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    context: int | None = None
    batch: int = 1
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the GPU
    max_num_seqs: int | None = None
    weights_bytes_per_gpu: int | None = None  # measured (a startup log) instead of counted
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    enforce_eager: bool = False
    vllm_version: str | None = None  # None: the newest release the planner knows
    nodes: int = 1  # machines the replica spans (NCCL over the network)
    # The sampler's top-k/top-p path a startup log names ("flashinfer", "native"); None:
    # the release's usual one.
    sampler: str | None = None
    expert_parallel: bool = False  # --enable-expert-parallel: whole experts per rank


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """vLLM's KV allocation and what it holds, for one replica of the deployment."""

    request: PlanRequest
    tp: int
    pp: int
    replicas: int
    model_dtype: str
    weights_dtype: str
    kv_dtype: str
    block_size: int
    max_model_len: int
    context: int
    params: int
    active_params: int
    weights_bytes: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    page_bytes: int
    groups: tuple[KVGroup, ...]
    group_size: int
    memory: MemoryBudget
    num_blocks: int
    kv_capacity_tokens: int
    max_concurrency: float
    max_concurrency_at_max_len: float
    blocks_per_sequence: int
    kv_bytes_per_sequence: int
    max_sequences: int
    fits: bool
    startup_ok: bool
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    accounting: AccountingChoice | None = None
    # When unsure (see `unsure`) the plan itself is the pessimistic end and this the
    # optimistic one; else equal.
    kv_capacity_tokens_high: int = 0
    unsure: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def kv_capacity_range(self) -> tuple[int, int]:
        """Token capacity, low and high end (equal when the planner is sure)."""
        return self.kv_capacity_tokens, max(self.kv_capacity_tokens_high, self.kv_capacity_tokens)

    @property
    def vllm_kv_cache_dtype(self) -> str:
        """The value to pass to `vllm serve --kv-cache-dtype` for this plan."""
        if self.request.kv_dtype.strip().lower() == "auto":
            return "auto"
        return VLLM_KV_FLAG[self.kv_dtype]

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: vLLM keeps one as the null block."""
        return max(self.num_blocks - 1, 0)

    @property
    def kv_allocated_bytes_per_gpu(self) -> int:
        """Bytes vLLM actually allocates for KV on the limiting GPU (whole blocks)."""
        return self.num_blocks * self.page_bytes * self.group_size

    def breakdown(self) -> dict[str, int]:
        """Memory of the limiting GPU by use, in bytes (sums to the device total)."""
        m = self.memory
        kv = self.kv_allocated_bytes_per_gpu
        parts = {
            "weights": m.weights_bytes,
            "kv_cache": kv,
            "activation_peak": m.activation_bytes,
            "non_torch": m.non_torch_bytes,
            "cuda_graphs": m.cuda_graph_bytes,
            # KV budget left over by rounding down to whole blocks.
            "kv_rounding": max(m.kv_cache_bytes - kv, 0),
        }
        if m.total_bytes:
            parts["unused_headroom"] = m.total_bytes - sum(parts.values())
        return parts

    def to_dict(self) -> dict[str, Any]:
        """The `kvscope plan --json` document."""
        req = self.request
        return {
            "model": req.model.name,
            "gpu": req.gpu.key if req.gpu is not None else "cpu",
            "num_gpus": req.num_gpus,
            "tp": self.tp,
            "pp": self.pp,
            "replicas": self.replicas,
            "model_dtype": self.model_dtype,
            "weights_dtype": self.weights_dtype,
            "kv_dtype": self.kv_dtype,
            "vllm_kv_cache_dtype": self.vllm_kv_cache_dtype,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "context": self.context,
            "batch": req.batch,
            "params": self.params,
            "active_params": self.active_params,
            "weights_bytes": self.weights_bytes,
            "weights_bytes_per_gpu": self.weights_bytes_per_gpu,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "page_bytes": self.page_bytes,
            "kv_cache_groups": len(self.groups),
            "gpu_memory_bytes": self.memory.total_bytes,
            "gpu_memory_utilization": self.memory.utilization,
            "kv_budget_bytes_per_gpu": self.memory.kv_cache_bytes,
            "num_blocks": self.num_blocks,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "max_concurrency": round(self.max_concurrency, 4),
            "max_concurrency_at_max_model_len": round(self.max_concurrency_at_max_len, 4),
            "blocks_per_sequence": self.blocks_per_sequence,
            "kv_bytes_per_sequence": self.kv_bytes_per_sequence,
            "max_sequences": self.max_sequences,
            "fits": self.fits,
            "startup_ok": self.startup_ok,
            "kv_capacity_tokens_range": list(self.kv_capacity_range),
            "unsure": list(self.unsure),
            "vllm_accounting": None if self.accounting is None else self.accounting.accounting.key,
            "vllm_version": None if self.accounting is None else self.accounting.version,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "breakdown": self.breakdown(),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def valid_tp_sizes(arch: ModelArch, limit: int | None = None) -> list[int]:
    """TP sizes vLLM accepts: they divide the attention heads, and KV heads split evenly
    (kv % tp == 0) or replicate evenly (tp % kv == 0)."""
    top = arch.num_attention_heads if limit is None else min(limit, arch.num_attention_heads)
    out = []
    for tp in range(1, top + 1):
        if arch.num_attention_heads % tp:
            continue
        kv = arch.kv_heads_cached if arch.mla is not None else arch.num_kv_heads
        if arch.mla is None and (kv % tp if kv >= tp else tp % kv):
            continue
        out.append(tp)
    return out


def _check_tp(arch: ModelArch, tp: int) -> None:
    if tp < 1:
        raise InvalidInput(f"tensor parallel size must be at least 1, got {tp}")
    if tp in valid_tp_sizes(arch):
        return
    sizes = ", ".join(map(str, valid_tp_sizes(arch)))
    if arch.num_attention_heads % tp:
        why = f"does not divide the {arch.num_attention_heads} attention heads"
    else:
        why = f"does not split or replicate the {arch.num_kv_heads} KV heads evenly"
    raise InvalidInput(f"tensor parallel size {tp} {why} of {arch.name}; valid tp sizes: {sizes}")


def _parallelism(req: PlanRequest) -> tuple[int, int, int]:
    arch = req.model
    if req.num_gpus < 1:
        raise InvalidInput(f"number of GPUs must be at least 1, got {req.num_gpus}")
    if req.pp < 1:
        raise InvalidInput(f"pipeline parallel size must be at least 1, got {req.pp}")
    if req.num_gpus % req.pp:
        raise InvalidInput(
            f"pipeline parallel size {req.pp} does not divide the {req.num_gpus} GPUs"
        )
    tp = req.tp if req.tp is not None else req.num_gpus // req.pp
    _check_tp(arch, tp)
    pp_partition(arch.num_layers, req.pp)  # raises when pp exceeds the layer count
    if req.num_gpus % (tp * req.pp):
        raise InvalidInput(
            f"{req.num_gpus} GPUs cannot be split into replicas of tp {tp} x pp {req.pp} = "
            f"{tp * req.pp} GPUs; use a multiple of {tp * req.pp}"
        )
    return tp, req.pp, req.num_gpus // (tp * req.pp)


def _lengths(req: PlanRequest) -> tuple[int, int]:
    limit = req.model.max_position_embeddings
    max_len = req.max_model_len or limit
    if not 1 <= max_len <= limit:
        raise InvalidInput(
            f"max model length {max_len} is above the model's maximum of {limit} tokens "
            f"(max_position_embeddings); valid: 1..{limit}"
        )
    context = req.context or max_len
    if not 1 <= context <= max_len:
        raise InvalidInput(
            f"context {context} is above the max model length of {max_len} tokens; "
            f"valid: 1..{max_len}"
        )
    return max_len, context


def _block_size(req: PlanRequest) -> int:
    bs = req.block_size or default_block_size(req.model)
    if bs not in BLOCK_SIZES:
        raise InvalidInput(
            f"block size {bs} is not one vLLM accepts; valid choices: "
            + ", ".join(map(str, BLOCK_SIZES))
        )
    return bs


# ---------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------


def _unsure_reasons(
    req: PlanRequest, choice: AccountingChoice, tp: int, pp: int
) -> tuple[str, ...]:
    """Why the planner cannot give one number (empty when published logs back it)."""
    out = []
    if not choice.known:
        out.append(f"vLLM {choice.version} is a release the planner has no accounting for")
    elif not choice.accounting.calibrated:
        out.append(
            f"the {choice.accounting.key} accounting (vLLM {choice.accounting.versions}) is "
            "not checked against published startup logs"
        )
    elif tp * pp > 1 and not choice.accounting.calibrated_multi_gpu:
        out.append(
            f"no published log of vLLM {choice.accounting.versions} checks its memory with "
            "tensor or pipeline parallelism"
        )
    if req.nodes > 1:
        out.append(f"the replica spans {req.nodes} nodes: NCCL's network buffers are unmeasured")
    return tuple(out)


def _batch_limits(req: PlanRequest) -> tuple[int, int]:
    """max_num_batched_tokens and max_num_seqs: given, or vLLM's defaults for the GPU."""
    if req.gpu is not None:
        tokens, seqs = default_batch_limits(req.gpu.visible_bytes, req.gpu.name)
    else:
        tokens, seqs = DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
    tokens = req.max_num_batched_tokens if req.max_num_batched_tokens is not None else tokens
    seqs = req.max_num_seqs if req.max_num_seqs is not None else seqs
    if tokens < 1 or seqs < 1:
        raise InvalidInput(
            f"max_num_batched_tokens and max_num_seqs must be at least 1, got {tokens} and {seqs}"
        )
    return tokens, seqs


def plan_capacity(req: PlanRequest) -> CapacityPlan:
    """vLLM's KV allocation for one replica, and what it holds at the requested context."""
    arch = req.model
    tp, pp, replicas = _parallelism(req)
    max_len, context = _lengths(req)
    bs = _block_size(req)
    if req.batch < 1:
        raise InvalidInput(f"batch must be at least 1, got {req.batch}")
    if req.gpu is None and req.kv_cache_memory_bytes is None:
        raise InvalidInput(
            "without a GPU (a CPU engine) the KV size must be given: --kv-memory-bytes "
            "(VLLM_CPU_KVCACHE_SPACE in bytes)"
        )
    choice = accounting_for(req.vllm_version)
    util = (
        req.gpu_memory_utilization
        if req.gpu_memory_utilization is not None
        else choice.accounting.default_gpu_memory_utilization
    )
    batched, max_seqs = _batch_limits(req)
    served = served_dtype(arch, req.model_dtype)
    wdt = resolve_weight_dtype(arch, req.weights_dtype, req.model_dtype)
    kv = resolve_kv_dtype(req.kv_dtype, arch, req.model_dtype)
    groups = kv_groups(arch)
    page = page_bytes(arch, kv, bs, tp)
    total_mem = req.gpu.visible_bytes if req.gpu is not None else 0
    unsure = _unsure_reasons(req, choice, tp, pp) if req.kv_cache_memory_bytes is None else ()
    stages = pp_partition(arch.num_layers, pp)

    stage_weights = [
        req.weights_bytes_per_gpu
        if req.weights_bytes_per_gpu is not None
        else stage_weight_bytes(arch, stage, i == 0, i == pp - 1, wdt, served, tp)
        for i, stage in enumerate(stages)
    ]

    def smallest_stage(which: int) -> tuple[int, MemoryBudget, int]:
        """The stage with the fewest blocks, under the point (1), optimistic (0) or
        pessimistic (2) overheads; an override replaces the estimate at every end."""
        best: tuple[int, MemoryBudget, int] | None = None
        for index, stage in enumerate(stages):
            last = index == pp - 1
            weights = stage_weights[index]
            est = overheads(
                choice,
                arch,
                served,
                tp,
                pp,
                batched,
                max_seqs,
                last,
                req.enforce_eager or req.gpu is None,
                which,
                bool(unsure),
                req.nodes,
                req.sampler,
                req.expert_parallel,
            )
            budget = memory_budget(
                total_mem,
                weights,
                req.activation_bytes if req.activation_bytes is not None else est.activation,
                req.non_torch_bytes if req.non_torch_bytes is not None else est.non_torch,
                req.cuda_graph_bytes if req.cuda_graph_bytes is not None else est.cuda_graphs,
                util,
                req.kv_cache_memory_bytes,
            )
            gsize = group_size_on_stage(groups, stage)
            blocks = num_blocks(max(budget.kv_cache_bytes, 0), page, gsize)
            if best is None or blocks < best[0]:
                best = (blocks, budget, gsize)
        assert best is not None
        return best

    blocks, memory, gsize = smallest_stage(2 if unsure else 1)
    high_tokens = (smallest_stage(0)[0] if unsure else blocks) // len(groups) * bs

    per_request_max = blocks_per_request(groups, max_len, bs, batched)
    per_request_ctx = blocks_per_request(groups, context, bs, batched)
    per_sequence = blocks_per_request(groups, context, bs, batched, capped=True)
    usable = max(blocks - 1, 0)
    max_sequences = usable // per_sequence
    params = param_count(arch)
    notes = list(arch.notes)
    if memory.kv_cache_bytes <= 0:
        notes.append(
            "no memory left for the KV cache: weights and overheads exceed the budget "
            "(vLLM: 'No available memory for the cache blocks')"
        )
    elif memory.total_bytes and memory.used_bytes > memory.total_bytes:
        notes.append("the explicit KV size plus weights and overheads exceed the GPU memory")
    startup_ok = memory.fits and per_request_max * page * gsize <= memory.kv_cache_bytes
    if memory.kv_cache_bytes > 0 and not startup_ok:
        notes.append(
            f"vLLM refuses to start: one {max_len:,}-token request needs more KV cache than "
            "is available; lower --max-model-len"
        )
    if max_sequences > max_seqs:
        notes.append(
            f"memory holds {max_sequences} sequences but vLLM schedules at most "
            f"max_num_seqs={max_seqs} at once"
        )
    if unsure:
        notes.append(
            "unsure (" + "; ".join(unsure) + "): the plan is the low end of a range whose "
            f"high end is {high_tokens:,} tokens"
        )
    return CapacityPlan(
        request=req,
        tp=tp,
        pp=pp,
        replicas=replicas,
        model_dtype=served,
        weights_dtype=wdt,
        kv_dtype=kv,
        block_size=bs,
        max_model_len=max_len,
        context=context,
        params=params.total,
        active_params=params.active(arch),
        weights_bytes=weight_bytes(arch, wdt, served),
        weights_bytes_per_gpu=memory.weights_bytes,
        kv_bytes_per_token=kv_bytes_per_token(arch, kv),
        kv_bytes_per_token_per_gpu=token_bytes_per_layer(arch, kv, tp)
        * max(len(s) for s in stages),
        page_bytes=page,
        groups=groups,
        group_size=gsize,
        memory=memory,
        num_blocks=blocks,
        kv_capacity_tokens=blocks // len(groups) * bs,
        max_concurrency=blocks / per_request_ctx,
        max_concurrency_at_max_len=blocks / per_request_max,
        blocks_per_sequence=per_sequence,
        kv_bytes_per_sequence=sequence_bytes(arch, kv, context, bs, batched),
        max_sequences=max_sequences,
        fits=memory.fits and req.batch <= max_sequences,
        startup_ok=startup_ok,
        max_num_batched_tokens=batched,
        max_num_seqs=max_seqs,
        accounting=choice,
        kv_capacity_tokens_high=high_tokens,
        unsure=unsure,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------
# Curves, maps and searches (vectorised)
# ---------------------------------------------------------------------------------------


def sequences_at(plan: CapacityPlan, contexts: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """How many sequences of each context length fit at once in this plan's blocks."""
    per = blocks_per_request_array(
        plan.groups, contexts, plan.block_size, plan.max_num_batched_tokens, capped=True
    )
    return np.asarray(plan.usable_blocks // per, dtype=np.int64)


def concurrency_at(plan: CapacityPlan, contexts: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """vLLM's max concurrency (num_blocks / blocks per request) at each context length."""
    per = blocks_per_request_array(
        plan.groups, contexts, plan.block_size, plan.max_num_batched_tokens
    )
    return np.asarray(plan.num_blocks / per, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class FitsMap:
    """A context x batch grid: which combinations fit, and the longest context per batch."""

    contexts: npt.NDArray[np.int64]
    batches: npt.NDArray[np.int64]
    fits: npt.NDArray[np.bool_]
    frontier: npt.NDArray[np.int64]


def oom_frontier(plan: CapacityPlan, batches: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Longest context (tokens) that still fits for each batch size; 0 where none does."""
    b = np.asarray(batches, dtype=np.int64)
    bs = plan.block_size
    # Blocks per sequence only change at block boundaries, so the answer is a multiple of
    # the block size (or the max model length itself).
    steps = np.minimum(np.arange(1, -(-plan.max_model_len // bs) + 1) * bs, plan.max_model_len)
    per = blocks_per_request_array(plan.groups, steps, bs, plan.max_num_batched_tokens, capped=True)
    allowed = plan.usable_blocks // np.maximum(b, 1)
    index = np.searchsorted(per, allowed, side="right") - 1
    return np.where(index >= 0, steps[np.clip(index, 0, None)], 0).astype(np.int64)


def fits_map(plan: CapacityPlan, contexts: npt.ArrayLike, batches: npt.ArrayLike) -> FitsMap:
    """Fits grid (rows = batches, columns = contexts) and the OOM frontier per batch."""
    ctx = np.asarray(contexts, dtype=np.int64)
    b = np.asarray(batches, dtype=np.int64)
    per = blocks_per_request_array(
        plan.groups, ctx, plan.block_size, plan.max_num_batched_tokens, capped=True
    )
    grid = (b[:, None] * per[None, :]) <= plan.usable_blocks
    grid &= (ctx <= plan.max_model_len)[None, :]
    return FitsMap(contexts=ctx, batches=b, fits=grid, frontier=oom_frontier(plan, b))


def plans_by_kv_dtype(req: PlanRequest, kv_dtypes: Sequence[str]) -> dict[str, CapacityPlan]:
    """The same request under several KV dtypes (invalid ones for the model are skipped)."""
    out: dict[str, CapacityPlan] = {}
    for kv in kv_dtypes:
        try:
            resolve_kv_dtype(kv, req.model, req.model_dtype)
        except InvalidInput:
            continue
        plan = plan_capacity(replace(req, kv_dtype=kv))
        out.setdefault(plan.kv_dtype, plan)
    return out


@dataclass(frozen=True, slots=True)
class Deployment:
    """The smallest GPU count (and its split) that serves a target context and concurrency."""

    num_gpus: int
    tp: int
    pp: int
    replicas: int
    sequences: int
    plan: CapacityPlan


def smallest_deployment(
    req: PlanRequest,
    context: int,
    concurrency: int,
    max_gpus: int = 64,
    max_tp: int = 8,
) -> Deployment:
    """Fewest GPUs (then fewest pipeline stages) holding `concurrency` sequences of `context`.

    GPUs may be split into replicas of tp x pp; TP stays within `max_tp` (one NVLink
    domain). Sequences across replicas add up.
    """
    if concurrency < 1:
        raise InvalidInput(f"target concurrency must be at least 1, got {concurrency}")
    tps = valid_tp_sizes(req.model, max_tp)
    single: dict[tuple[int, int], CapacityPlan | None] = {}

    # Deploy with --max-model-len at the target context unless the request names one.
    max_len = max(req.max_model_len or context, context)

    def replica(tp: int, pp: int) -> CapacityPlan | None:
        if (tp, pp) not in single:
            try:
                plan = plan_capacity(
                    replace(
                        req,
                        num_gpus=tp * pp,
                        tp=tp,
                        pp=pp,
                        max_model_len=max_len,
                        context=context,
                        batch=1,
                    )
                )
                single[(tp, pp)] = plan if plan.startup_ok else None
            except InvalidInput:
                single[(tp, pp)] = None
        return single[(tp, pp)]

    for n in range(1, max_gpus + 1):
        best: Deployment | None = None
        for pp in range(1, min(n, req.model.num_layers) + 1):
            for tp in tps:
                if n % (tp * pp):
                    continue
                plan = replica(tp, pp)
                if plan is None or plan.max_sequences == 0:
                    continue
                replicas = n // (tp * pp)
                total = replicas * plan.max_sequences
                if total >= concurrency and (best is None or total > best.sequences):
                    best = Deployment(n, tp, pp, replicas, total, plan)
            if best is not None:
                return best
    raise InvalidInput(
        f"no deployment of up to {max_gpus} GPUs holds {concurrency} sequences of "
        f"{context:,} tokens; try a smaller KV dtype, a bigger GPU or a shorter context"
    )
