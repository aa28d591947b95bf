"""vLLM's per-GPU memory budget: what is left for the KV cache after weights and overheads.

available_kv = total x gpu_memory_utilization - (weights + activation peak + non-torch
memory + CUDA-graph reserve), or an explicit kv_cache_memory_bytes / VLLM_CPU_KVCACHE_SPACE.
The three overheads are estimates (vLLM measures them in a profiling run); every one can be
overridden, and docs/planner.md says where each estimate comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import InvalidInput
from planner.models import ModelArch

GIB = 1 << 30
# vLLM's default gpu_memory_utilization (0.9 up to 0.11.1; later releases use 0.92).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# vLLM's default max_num_seqs for online serving; the sampler warm-up sizes its logits.
DEFAULT_MAX_NUM_SEQS = 256
# Non-torch memory a worker allocates during profiling (cuBLAS workspaces, NCCL and
# custom all-reduce buffers). vLLM logs it as "non_torch_memory takes 0.20GiB".
NON_TORCH_SINGLE_GPU = round(0.2 * GIB)
NON_TORCH_MULTI_GPU = round(0.5 * GIB)
# CUDA graphs captured for the decode batch sizes (vLLM logs "Graph capturing finished in
# N secs, took 0.5x GiB" for 7-8B models). Newer releases subtract an estimate of it
# from the KV budget; older ones capture it out of the (1 - utilization) headroom.
CUDA_GRAPH_ESTIMATE = round(0.5 * GIB)


def estimate_activation_bytes(
    arch: ModelArch,
    served_dtype: str,
    tp: int = 1,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    with_sampler: bool = True,
) -> int:
    """Estimated peak of vLLM's profiling forward pass on one GPU.

    vLLM runs a dummy batch of max_num_batched_tokens tokens and records the torch peak.
    The live tensors at the peak of one decoder layer are, per token: the residual stream
    and its normed copy and the attention input/output (4 x hidden), the fused QKV
    projection output, and the feed-forward intermediate (gate and up halves, or for MoE
    the fused-expert caches of the top-k experts). The sampler warm-up then holds float32
    logits (and probabilities) for max_num_seqs requests over the vocabulary.
    """
    elem = 4 if served_dtype == "float32" else 2
    h = arch.hidden_size
    if arch.mla is not None:
        m = arch.mla
        qkv = (
            arch.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) // tp
            + m.kv_lora_rank
            + m.qk_rope_head_dim
        )
    else:
        qkv = (arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim // tp
    ffn = 2 * arch.intermediate_size // tp
    if arch.moe is not None:
        dense_layers = arch.num_layers - len(arch.moe.moe_layers)
        # fused_moe keeps gate+up, the activated half and the down output per routed expert.
        per_expert = 3 * arch.moe.expert_intermediate_size // tp + h
        ffn = max(ffn if dense_layers else 0, arch.moe.experts_per_token * per_expert)
    forward = max_num_batched_tokens * (4 * h + qkv + ffn) * elem
    sampler = max_num_seqs * arch.vocab_size * 4 * 2 if with_sampler else 0
    return forward + sampler


def estimate_non_torch_bytes(tp: int = 1, pp: int = 1) -> int:
    """Estimated non-torch memory per worker (larger when it talks to other GPUs)."""
    return NON_TORCH_SINGLE_GPU if tp * pp == 1 else NON_TORCH_MULTI_GPU


def estimate_cuda_graph_bytes(enforce_eager: bool = False) -> int:
    """Estimated CUDA-graph memory per GPU (zero with --enforce-eager)."""
    return 0 if enforce_eager else CUDA_GRAPH_ESTIMATE


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
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
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
