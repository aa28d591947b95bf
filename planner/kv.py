"""KV cache bytes, pages and blocks exactly as vLLM V1 computes them.

Follows vllm/v1/kv_cache_interface.py (page_size_bytes per layer spec) and
vllm/v1/core/kv_cache_utils.py (grouping of full/sliding layers, get_num_blocks,
reported token capacity, max concurrency). Everything here is per tensor-parallel rank
unless a name says "replica".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt

from planner.errors import InvalidInput, UnknownChoice
from planner.models import DTYPE_ALIASES, ModelArch, served_dtype

DEFAULT_BLOCK_SIZE = 16
# FlashMLA (vLLM's default MLA backend on Hopper) requires 64-token blocks.
MLA_BLOCK_SIZE = 64
# vLLM V1's default chunked-prefill token budget for online serving; sliding-window layers
# reserve window - 1 + max_num_batched_tokens tokens per request.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# fp8_ds_mla (FlashMLA sparse): 656 bytes per token per layer, see flashmla_sparse.py.
FP8_DS_MLA_TOKEN_BYTES = 656
# Per-token-head scales of int8/int4 KV are float32, one for K and one for V.
SCALE_BYTES = 4

KV_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8", "int8", "int4", "nvfp4", "fp8_ds_mla")
_KV_ALIASES = {
    "auto": "auto",
    **DTYPE_ALIASES,
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "int8": "int8",
    "int8_per_token_head": "int8",
    "int4": "int4",
    "int4_per_token_head": "int4",
    "nvfp4": "nvfp4",
    "fp8_ds_mla": "fp8_ds_mla",
}
# What to pass to `vllm serve --kv-cache-dtype` for each canonical KV dtype.
VLLM_KV_FLAG = {
    "bfloat16": "bfloat16",
    # float16/float32 KV: run the model in that dtype (--dtype) and leave the KV on auto.
    "float16": "auto",
    "float32": "auto",
    "fp8": "fp8",
    "int8": "int8_per_token_head",
    "int4": "int4_per_token_head",
    "nvfp4": "nvfp4",
    "fp8_ds_mla": "fp8_ds_mla",
}
_FLOAT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_dtype_choices(arch: ModelArch | None = None) -> list[str]:
    """KV dtypes the planner accepts (for an MLA model, those vLLM's MLA backends take)."""
    if arch is not None and arch.mla is not None:
        return ["auto", "bfloat16", "float16", "float32", "fp8", "fp8_ds_mla"]
    return [d for d in KV_DTYPES if d != "fp8_ds_mla"]


def resolve_kv_dtype(kv_dtype: str, arch: ModelArch, model_dtype: str = "auto") -> str:
    """Canonical KV dtype; 'auto' follows the served model dtype, as in vLLM."""
    key = _KV_ALIASES.get(kv_dtype.strip().lower())
    if key is None:
        raise UnknownChoice("KV cache dtype", kv_dtype, [*KV_DTYPES, "fp8_e4m3", "fp8_e5m2"])
    if key == "auto":
        key = served_dtype(arch, model_dtype)
    if arch.mla is not None and key in ("int8", "int4", "nvfp4"):
        raise InvalidInput(
            f"KV cache dtype {kv_dtype!r} is not available for MLA models; valid choices: "
            + ", ".join(kv_dtype_choices(arch))
        )
    if arch.mla is None and key == "fp8_ds_mla":
        raise InvalidInput(
            "KV cache dtype 'fp8_ds_mla' exists only for MLA models; valid choices: "
            + ", ".join(kv_dtype_choices(arch))
        )
    return key


def head_token_bytes(head_size: int, kv: str) -> int:
    """Bytes one cached head takes for one token for K or for V (scales included)."""
    if kv in _FLOAT_BYTES:
        return head_size * _FLOAT_BYTES[kv]
    if kv == "fp8":
        return head_size
    if kv == "int8":
        return head_size + SCALE_BYTES
    if kv == "int4":
        return head_size // 2 + SCALE_BYTES
    if kv == "nvfp4":
        # Packed fp4 data plus one fp8 scale per 16 elements (nvfp4_kv_cache_full_dim).
        return head_size // 2 + head_size // 16
    raise InvalidInput(f"KV cache dtype {kv!r} has no per-head layout")


def kv_heads_per_rank(arch: ModelArch, tp: int = 1) -> int:
    """KV heads one TP rank caches: max(1, kv_heads // tp); MLA keeps its one latent."""
    if arch.mla is not None:
        return 1
    return max(1, arch.num_kv_heads // tp)


def token_bytes_per_layer(arch: ModelArch, kv: str, tp: int = 1) -> int:
    """Bytes one token takes in one layer's cache on one TP rank."""
    if arch.mla is not None:
        if kv == "fp8_ds_mla":
            return FP8_DS_MLA_TOKEN_BYTES
        # MLA caches one latent (kv_lora_rank + qk_rope_head_dim) per token: no factor 2.
        return head_token_bytes(arch.kv_head_size, kv)
    heads = kv_heads_per_rank(arch, tp)
    return heads * 2 * head_token_bytes(arch.head_dim, kv)


def page_bytes(arch: ModelArch, kv: str, block_size: int, tp: int = 1) -> int:
    """vLLM's page_size_bytes: one block of one layer on one TP rank."""
    return block_size * token_bytes_per_layer(arch, kv, tp)


def kv_bytes_per_token(arch: ModelArch, kv: str, tp: int = 1) -> int:
    """Bytes per token over all layers (whole replica at tp=1; one TP rank's share else)."""
    return arch.num_layers * token_bytes_per_layer(arch, kv, tp)


# ---------------------------------------------------------------------------------------
# vLLM's KV cache groups
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KVGroup:
    """A KV cache group: layers that share one block table (same window)."""

    window: int | None
    layers: tuple[int, ...]


@cache
def kv_groups(arch: ModelArch) -> tuple[KVGroup, ...]:
    """Group the layers the way vLLM's get_kv_cache_groups does for this model."""
    windows = arch.windows
    kinds: dict[int | None, list[int]] = {}
    for index, window in enumerate(windows):
        kinds.setdefault(window, []).append(index)
    if len(kinds) == 1:
        window, layers = next(iter(kinds.items()))
        return (KVGroup(window, tuple(layers)),)
    # Hybrid: split every type into groups of `group_size` layers (layers[i::num_groups]),
    # group_size being the smallest type count, or the largest when they are close (1.5x).
    sizes = [len(v) for v in kinds.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups: list[KVGroup] = []
    for window, layers in kinds.items():
        count = math.ceil(len(layers) / group_size)
        groups += [KVGroup(window, tuple(layers[i::count])) for i in range(count)]
    return tuple(groups)


def pp_partition(num_layers: int, pp: int) -> list[range]:
    """Layer ranges per pipeline stage, as vLLM's get_pp_indices splits them."""
    if pp < 1 or pp > num_layers:
        raise InvalidInput(
            f"pipeline parallel size {pp} is not between 1 and the layer count {num_layers}"
        )
    sizes = [num_layers // pp] * pp
    # vLLM hands the remainder to the stages before the last (the last holds the lm_head).
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def group_size_on_stage(groups: Sequence[KVGroup], stage: range) -> int:
    """Layers per group on one stage (the max over groups): vLLM's num_layers divisor."""
    return max(sum(1 for layer in g.layers if layer in stage) for g in groups)


def num_blocks(available_bytes: int, page: int, group_size: int) -> int:
    """vLLM's get_num_blocks: available // page_size // num_layers, floored at zero."""
    if group_size <= 0:
        return 0
    return max(int(available_bytes // page // group_size), 0)


def window_tokens(window: int, context: int, max_num_batched_tokens: int) -> int:
    """Tokens a sliding-window layer holds for one request (SlidingWindowSpec)."""
    return min(window - 1 + max_num_batched_tokens, context)


def blocks_per_request(
    groups: Sequence[KVGroup],
    context: int,
    block_size: int,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    capped: bool = False,
) -> int:
    """Blocks one request of `context` tokens needs across all groups.

    capped=False is vLLM's max_memory_usage_bytes (what its max concurrency divides by):
    a sliding group reserves its window plus one block even for a short request.
    capped=True is what a running request can actually hold: never more blocks in a
    sliding group than the request has tokens for.
    """
    full_blocks = math.ceil(context / block_size)
    total = 0
    for g in groups:
        if g.window is None:
            total += full_blocks
        else:
            # +1: the window need not start on a block boundary.
            held = window_tokens(g.window, context, max_num_batched_tokens)
            blocks = math.ceil(held / block_size) + 1
            total += min(blocks, full_blocks) if capped else blocks
    return total


def blocks_per_request_array(
    groups: Sequence[KVGroup],
    contexts: npt.ArrayLike,
    block_size: int,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    capped: bool = False,
) -> npt.NDArray[np.int64]:
    """Vectorised blocks_per_request over many context lengths."""
    ctx = np.asarray(contexts, dtype=np.int64)
    full_blocks = -(-ctx // block_size)
    total = np.zeros_like(ctx)
    full = sum(1 for g in groups if g.window is None)
    if full:
        total += full * full_blocks
    for g in groups:
        if g.window is not None:
            held = np.minimum(g.window - 1 + max_num_batched_tokens, ctx)
            blocks = -(-held // block_size) + 1
            total += np.minimum(blocks, full_blocks) if capped else blocks
    return total


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    """What vLLM allocates for a given KV budget: blocks, tokens, concurrency."""

    kv_dtype: str
    block_size: int
    page_bytes: int
    num_groups: int
    group_size: int
    kv_cache_bytes: int
    num_blocks: int
    capacity_tokens: int
    max_model_len: int
    blocks_per_request: int
    max_concurrency: float

    @property
    def logged_tokens(self) -> int:
        """The "KV cache size: N tokens" vLLM 0.32 logs: concurrency x max_model_len.

        Equal to `capacity_tokens` only when max_model_len is a multiple of the block size.
        """
        return int(self.max_concurrency * self.max_model_len)


def vllm_kv_cache(
    arch: ModelArch,
    kv_cache_bytes: int,
    block_size: int | None = None,
    kv_dtype: str = "auto",
    model_dtype: str = "auto",
    tp: int = 1,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> KVCacheLayout:
    """vLLM's block and token capacity for an explicit KV budget on one worker (PP = 1).

    This is the case of `kv_cache_memory_bytes` on a GPU or VLLM_CPU_KVCACHE_SPACE on CPU:
    num_blocks = bytes // page_size // layers_per_group, tokens = num_blocks // groups *
    block_size, max concurrency = num_blocks / blocks for one max_model_len request.
    """
    if kv_cache_bytes < 0:
        raise InvalidInput(f"KV cache bytes must not be negative, got {kv_cache_bytes}")
    kv = resolve_kv_dtype(kv_dtype, arch, model_dtype)
    bs = block_size or default_block_size(arch)
    length = max_model_len or arch.max_position_embeddings
    groups = kv_groups(arch)
    page = page_bytes(arch, kv, bs, tp)
    gsize = group_size_on_stage(groups, range(arch.num_layers))
    blocks = num_blocks(kv_cache_bytes, page, gsize)
    per_request = blocks_per_request(groups, length, bs, max_num_batched_tokens)
    return KVCacheLayout(
        kv_dtype=kv,
        block_size=bs,
        page_bytes=page,
        num_groups=len(groups),
        group_size=gsize,
        kv_cache_bytes=kv_cache_bytes,
        num_blocks=blocks,
        capacity_tokens=blocks // len(groups) * bs,
        max_model_len=length,
        blocks_per_request=per_request,
        max_concurrency=blocks / per_request,
    )


def default_block_size(arch: ModelArch) -> int:
    """16 tokens, or 64 for MLA models (FlashMLA's required block size)."""
    return MLA_BLOCK_SIZE if arch.mla is not None else DEFAULT_BLOCK_SIZE


def sequence_bytes(
    arch: ModelArch,
    kv: str,
    context: int,
    block_size: int,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> int:
    """Replica-wide KV bytes of one sequence of `context` tokens, block-rounded, windows on."""
    per_token = token_bytes_per_layer(arch, kv, 1)
    layers = [KVGroup(window, (i,)) for i, window in enumerate(arch.windows)]
    blocks = blocks_per_request(layers, context, block_size, max_num_batched_tokens, capped=True)
    return blocks * block_size * per_token
