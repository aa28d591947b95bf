"""vLLM's per-GPU memory budget: what is left for the KV cache after weights and overheads.

available_kv = total x gpu_memory_utilization - (weights + activation peak + non-torch
memory + CUDA-graph reserve), or an explicit kv_cache_memory_bytes / VLLM_CPU_KVCACHE_SPACE.
The three overheads are estimates by vLLM release (planner/overheads.py; vLLM measures them
in a profiling run); every one can be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import InvalidInput

GIB = 1 << 30
# vLLM's max_num_seqs on a small GPU or a CPU engine (large GPUs: planner.overheads).
DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """One GPU's memory as vLLM divides it."""

    total_bytes: int
    utilization: float
    budget_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_cache_bytes: int
    explicit_kv: bool

    @property
    def overhead_bytes(self) -> int:
        """Activation peak + non-torch + CUDA graphs."""
        return self.activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes

    @property
    def used_bytes(self) -> int:
        """Everything vLLM takes: weights, overheads and the KV budget."""
        return self.weights_bytes + self.overhead_bytes + self.kv_cache_bytes

    @property
    def fits(self) -> bool:
        """Whether weights, overheads and a positive KV budget fit on the device."""
        if self.kv_cache_bytes <= 0:
            return False
        return self.total_bytes == 0 or self.used_bytes <= self.total_bytes


def memory_budget(
    total_bytes: int,
    weights_bytes: int,
    activation_bytes: int,
    non_torch_bytes: int,
    cuda_graph_bytes: int,
    gpu_memory_utilization: float,
    kv_cache_memory_bytes: int | None = None,
) -> MemoryBudget:
    """KV budget on one GPU: explicit bytes, or total x utilization minus the rest."""
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidInput(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
        )
    if kv_cache_memory_bytes is not None:
        if kv_cache_memory_bytes <= 0:
            raise InvalidInput(f"KV memory bytes must be positive, got {kv_cache_memory_bytes}")
        return MemoryBudget(
            total_bytes=total_bytes,
            utilization=gpu_memory_utilization,
            budget_bytes=weights_bytes
            + activation_bytes
            + non_torch_bytes
            + cuda_graph_bytes
            + kv_cache_memory_bytes,
            weights_bytes=weights_bytes,
            activation_bytes=activation_bytes,
            non_torch_bytes=non_torch_bytes,
            cuda_graph_bytes=cuda_graph_bytes,
            kv_cache_bytes=kv_cache_memory_bytes,
            explicit_kv=True,
        )
    if total_bytes <= 0:
        raise InvalidInput(
            "no device memory to budget from: give the KV size explicitly "
            "(--kv-memory-bytes, as kv_cache_memory_bytes or VLLM_CPU_KVCACHE_SPACE)"
        )
    budget = int(total_bytes * gpu_memory_utilization)
    kv = budget - (weights_bytes + activation_bytes + non_torch_bytes + cuda_graph_bytes)
    return MemoryBudget(
        total_bytes=total_bytes,
        utilization=gpu_memory_utilization,
        budget_bytes=budget,
        weights_bytes=weights_bytes,
        activation_bytes=activation_bytes,
        non_torch_bytes=non_torch_bytes,
        cuda_graph_bytes=cuda_graph_bytes,
        kv_cache_bytes=kv,
        explicit_kv=False,
    )
