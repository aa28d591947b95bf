"""Weight bytes per weight dtype: the whole model, one tensor-parallel rank, one stage.

Unquantized weights take their float width; quantized checkpoints quantize only the
projections and experts (with their scales) and keep embeddings, norms and routers in the
model dtype. docs/planner.md gives the formats and where each comes from.
"""

from __future__ import annotations

import math

from planner.errors import UnknownChoice
from planner.models.arch import DEFAULT_INT4_GROUP, DTYPE_ALIASES, ModelArch
from planner.models.params import Tensor, edge_tensors, layer_kinds, lm_head_tensor

# vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to a multiple of 64.
VOCAB_PADDING = 64
# What --weights-dtype accepts; "auto" is the checkpoint's quantization or the served dtype.
WEIGHT_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8", "int8", "int4")
_WEIGHT_ALIASES = {
    **DTYPE_ALIASES,
    "fp8": "fp8",
    "float8": "fp8",
    "int8": "int8",
    "w8a8": "int8",
    "int4": "int4",
    "w4a16": "int4",
    "auto": "auto",
}
_FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def served_dtype(arch: ModelArch, model_dtype: str = "auto") -> str:
    """The dtype vLLM runs the model in: `--dtype auto` serves float32 checkpoints in bf16."""
    wanted = DTYPE_ALIASES.get(model_dtype.lower()) if model_dtype != "auto" else None
    if model_dtype != "auto" and wanted is None:
        raise UnknownChoice("model dtype", model_dtype, ["auto", "bfloat16", "float16", "float32"])
    if wanted:
        return wanted
    return "bfloat16" if arch.config_dtype == "float32" else arch.config_dtype


def resolve_weight_dtype(arch: ModelArch, weights_dtype: str, model_dtype: str = "auto") -> str:
    """Normalise a weight dtype; 'auto' is the checkpoint's quantization or the served dtype."""
    key = _WEIGHT_ALIASES.get(weights_dtype.strip().lower())
    if key is None:
        raise UnknownChoice("weights dtype", weights_dtype, WEIGHT_DTYPES)
    if key == "auto":
        return arch.quant.dtype if arch.quant is not None else served_dtype(arch, model_dtype)
    return key


def _tensor_bytes(t: Tensor, params: int, dtype: str, float_bytes: int, group: int) -> float:
    """Bytes of `params` parameters of tensor group `t` stored as `dtype`."""
    if dtype in _FLOAT_BYTES:
        # Unquantized: every parameter in the weight dtype.
        return params * _FLOAT_BYTES[dtype]
    if not t.linear:
        # Quantized checkpoints keep embeddings, norms and routers in the model dtype.
        return params * float_bytes
    if dtype == "fp8":
        # One byte per weight plus an fp32 scale per 128x128 block (DeepSeek-style fp8).
        return params + params / group * 4
    if dtype == "int8":
        # One byte per weight plus an fp32 scale per output channel (W8A8 per-channel).
        return params + params / max(t.in_features, 1) * 4
    # int4: two weights per byte plus one fp16 scale per group of `group` input weights
    # (symmetric GPTQ/AWQ-style; zero points, where a format has them, are not counted).
    return params / 2 + params / group * 2


def shard_params(arch: ModelArch, t: Tensor, tp: int) -> int:
    """Parameters of tensor group `t` held by one of `tp` tensor-parallel ranks."""
    if t.shard == "replicated" or tp == 1:
        return t.params
    if t.shard == "kv":
        per_rank = max(1, arch.num_kv_heads // tp)
        return t.params * per_rank // arch.num_kv_heads
    if t.shard == "vocab":
        padded = math.ceil(arch.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
        return math.ceil(padded / tp) * (t.params // arch.vocab_size)
    return math.ceil(t.params / tp)


def tensors_bytes(
    arch: ModelArch,
    tensors: tuple[Tensor, ...],
    weights_dtype: str,
    model_dtype: str,
    tp: int = 1,
) -> float:
    """Bytes of a set of tensor groups on one TP rank (weights_dtype already resolved)."""
    float_bytes = _FLOAT_BYTES[model_dtype]
    group = _group_size(arch, weights_dtype)
    return sum(
        _tensor_bytes(t, shard_params(arch, t, tp), weights_dtype, float_bytes, group)
        for t in tensors
    )


def _group_size(arch: ModelArch, dtype: str) -> int:
    """Weights per scale: the checkpoint's own when it declares this dtype, else the default."""
    if arch.quant is not None and arch.quant.dtype == dtype:
        return arch.quant.group_size
    return 128 * 128 if dtype == "fp8" else DEFAULT_INT4_GROUP


def weight_bytes(arch: ModelArch, weights_dtype: str = "auto", model_dtype: str = "auto") -> int:
    """Bytes of all weights of one full copy of the model (no tensor or pipeline split)."""
    served = served_dtype(arch, model_dtype)
    wdt = resolve_weight_dtype(arch, weights_dtype, model_dtype)
    first, last = edge_tensors(arch)
    total = layers_bytes(arch, None, wdt, served)
    total += tensors_bytes(arch, (*first, *last), wdt, served)
    return math.ceil(total)


def layers_bytes(
    arch: ModelArch,
    layers: range | None,
    weights_dtype: str,
    model_dtype: str,
    tp: int = 1,
) -> float:
    """Bytes of decoder layers (None: all) on one TP rank (weights_dtype already resolved)."""
    total = 0.0
    for tensors, count in layer_kinds(arch, layers):
        total += count * tensors_bytes(arch, tensors, weights_dtype, model_dtype, tp)
    return total


def stage_weight_bytes(
    arch: ModelArch, stage: range, first: bool, last: bool, wdt: str, served: str, tp: int
) -> int:
    """Weight bytes on one GPU of a pipeline stage (its layers' TP share plus the edges)."""
    total = layers_bytes(arch, stage, wdt, served, tp)
    head, tail = edge_tensors(arch)
    edges: tuple[Tensor, ...] = ()
    if first:
        edges += head
    if last:
        edges += tail
        if arch.tie_word_embeddings and not first:
            # With PP the last stage loads its own copy of the tied embedding as lm_head.
            edges += (lm_head_tensor(arch),)
    total += tensors_bytes(arch, edges, wdt, served, tp)
    return math.ceil(total)
