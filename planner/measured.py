"""Plans from a real vLLM start: the flags and memory a startup log reports, predicted
against measured line by line, and re-plans that use the measured overheads.

Pure: the caller parses the log (probes.vllm.logparse.read_startup gives a value that
satisfies `StartupFacts`) and picks the model and GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from planner.capacity import CapacityPlan, PlanRequest, plan_capacity
from planner.errors import InvalidInput
from planner.gpus import GIB, GPUSpec, custom_gpu
from planner.models import ModelArch, served_dtype
from planner.overheads import accounting_for, activation_bytes


class StartupFacts(Protocol):
    """What a startup log says (None where it is silent)."""

    @property
    def version(self) -> str | None: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def tensor_parallel_size(self) -> int | None: ...
    @property
    def pipeline_parallel_size(self) -> int | None: ...
    @property
    def kv_cache_dtype(self) -> str | None: ...
    @property
    def enforce_eager(self) -> bool | None: ...
    @property
    def gpu_memory_utilization(self) -> float | None: ...
    @property
    def max_model_len(self) -> int | None: ...
    @property
    def max_num_batched_tokens(self) -> int | None: ...
    @property
    def max_num_seqs(self) -> int | None: ...
    @property
    def block_size(self) -> int | None: ...
    @property
    def total_gib(self) -> float | None: ...
    @property
    def weights_gib(self) -> float | None: ...
    @property
    def activation_gib(self) -> float | None: ...
    @property
    def non_torch_gib(self) -> float | None: ...
    @property
    def kv_gib(self) -> float | None: ...
    @property
    def kv_tokens(self) -> int | None: ...
    @property
    def device(self) -> str | None: ...
    @property
    def sampler(self) -> str | None: ...
    @property
    def enable_expert_parallel(self) -> bool | None: ...


def _gib(value: float | None) -> int | None:
    return None if value is None else round(value * GIB)


def request_from_log(
    facts: StartupFacts,
    model: ModelArch,
    gpu: GPUSpec | None,
    weights_dtype: str = "auto",
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    nodes: int = 1,
) -> PlanRequest:
    """The plan request of the deployment a log describes. The log's own total memory
    (printed by newer releases) wins over the catalog's figure for the GPU."""
    explicit = None
    if facts.device == "CPU":
        # A CPU engine: VLLM_CPU_KVCACHE_SPACE is the budget, no device to take it from.
        gpu, explicit = None, _gib(facts.kv_gib)
    elif facts.total_gib:
        printed = round(facts.total_gib * GIB)
        gpu = custom_gpu(facts.total_gib) if gpu is None else replace(gpu, visible_bytes=printed)
    if gpu is None and explicit is None:
        raise InvalidInput(
            "the log does not print the GPU's total memory; name the GPU (--gpu h100-sxm, "
            "custom:<GiB>)"
        )
    tp = facts.tensor_parallel_size or 1
    pp = facts.pipeline_parallel_size or 1
    kv = facts.kv_cache_dtype or "auto"
    return PlanRequest(
        model=model,
        gpu=gpu,
        num_gpus=tp * pp,
        tp=tp,
        pp=pp,
        weights_dtype=weights_dtype,
        model_dtype=facts.dtype or "auto",
        kv_dtype="fp8" if kv.startswith("fp8") else kv,
        gpu_memory_utilization=facts.gpu_memory_utilization or gpu_memory_utilization,
        kv_cache_memory_bytes=explicit,
        max_model_len=facts.max_model_len or max_model_len,
        block_size=facts.block_size,
        max_num_batched_tokens=facts.max_num_batched_tokens,
        max_num_seqs=facts.max_num_seqs,
        enforce_eager=bool(facts.enforce_eager),
        vllm_version=facts.version,
        nodes=nodes,
        sampler=facts.sampler,
        expert_parallel=bool(facts.enable_expert_parallel),
    )


@dataclass(frozen=True, slots=True)
class Line:
    """One part of a GPU's memory: what the log measured and what the planner predicted."""

    name: str
    measured: int | None
    predicted: int

    @property
    def error(self) -> float | None:
        """Predicted over measured, minus one (positive: the planner promised more)."""
        if not self.measured:
            return None
        return self.predicted / self.measured - 1


def compare(facts: StartupFacts, plan: CapacityPlan) -> list[Line]:
    """Measured against predicted, line by line, on the GPU that limits the cache. The
    overheads the log does not split are measured as one: requested - weights - KV."""
    m = plan.memory
    weights, kv = _gib(facts.weights_gib), _gib(facts.kv_gib)
    lumped = None
    if weights is not None and kv is not None and m.budget_bytes:
        lumped = m.budget_bytes - weights - kv
    lines = [
        Line("weights", weights, m.weights_bytes),
        Line("activation peak", _gib(facts.activation_gib), m.activation_bytes),
        Line("non-torch", _gib(facts.non_torch_gib), m.non_torch_bytes),
        Line("CUDA graphs (in the budget)", None, m.cuda_graph_bytes),
        Line("all overheads", lumped, m.overhead_bytes),
        Line("KV budget", kv, m.kv_cache_bytes),
        Line("KV tokens", facts.kv_tokens, plan.kv_capacity_tokens),
    ]
    return lines


def measured_request(facts: StartupFacts, logged: CapacityPlan, req: PlanRequest) -> PlanRequest:
    """`req` (a change of `logged`, the plan of the deployment the log describes) with the
    overheads the log measured in place of the estimates: re-plan other contexts, KV dtypes
    and batch limits of the same deployment from it. A change of max_num_batched_tokens or
    max_num_seqs moves the activation by the predicted change."""
    weights, kv = _gib(facts.weights_gib), _gib(facts.kv_gib)
    if weights is None or kv is None:
        raise InvalidInput(
            "the log has no 'Model loading took' and 'Available KV cache memory' lines: "
            "nothing measured to re-plan from"
        )
    overheads = logged.memory.budget_bytes - weights - kv
    acc = accounting_for(req.vllm_version).accounting
    served = served_dtype(req.model, req.model_dtype)

    def act(tokens: int, seqs: int) -> int:
        return activation_bytes(
            acc,
            req.model,
            served,
            logged.tp,
            tokens,
            seqs,
            sampler=req.sampler,
            expert_parallel=req.expert_parallel,
        )

    wanted = (
        req.max_num_batched_tokens or logged.max_num_batched_tokens,
        req.max_num_seqs or logged.max_num_seqs,
    )
    shift = act(*wanted) - act(logged.max_num_batched_tokens, logged.max_num_seqs)
    return replace(
        req,
        weights_bytes_per_gpu=weights,
        activation_bytes=max(overheads + shift, 0),
        non_torch_bytes=0,
        cuda_graph_bytes=0,
    )


@dataclass(frozen=True, slots=True)
class LogStudy:
    """A startup log against the planner: its deployment, the prediction, measured against
    predicted, and re-plans of the same deployment from the measured overheads."""

    request: PlanRequest
    predicted: CapacityPlan
    lines: list[Line]
    replans: list[CapacityPlan]


def study_log(
    facts: StartupFacts,
    model: ModelArch,
    gpu: GPUSpec | None,
    weights_dtype: str = "auto",
    kv_dtypes: tuple[str, ...] = ("auto", "fp8"),
    context: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
) -> LogStudy:
    """Everything `kvscope plan --from-log` and the Planner page show for one log."""
    if facts.kv_tokens is None and facts.kv_gib is None:
        raise InvalidInput(
            "the log holds no vLLM KV cache lines ('Available KV cache memory', 'GPU KV "
            "cache size'): give a startup log that ran past the memory profiling"
        )
    request = request_from_log(facts, model, gpu, weights_dtype=weights_dtype)
    predicted = plan_capacity(request)
    replans: list[CapacityPlan] = []
    if facts.weights_gib is not None and facts.kv_gib is not None and request.gpu is not None:
        changed = replace(
            request,
            max_num_batched_tokens=max_num_batched_tokens or request.max_num_batched_tokens,
            max_num_seqs=max_num_seqs or request.max_num_seqs,
        )
        measured = measured_request(facts, predicted, changed)
        replans = [
            plan_capacity(replace(measured, kv_dtype=kind, context=context)) for kind in kv_dtypes
        ]
    return LogStudy(request, predicted, compare(facts, predicted), replans)
