"""KV bytes, pages, groups and blocks, checked against vLLM's own formulas and data points."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.errors import InvalidInput, UnknownChoice
from planner.kv import (
    blocks_per_request,
    blocks_per_request_array,
    default_block_size,
    kv_bytes_per_token,
    kv_groups,
    kv_heads_per_rank,
    page_bytes,
    pp_partition,
    resolve_kv_dtype,
    sequence_bytes,
    token_bytes_per_layer,
    vllm_kv_cache,
)
from planner.models import ModelArch, from_config_dict, load_preset

GIB = 1 << 30

# KV bytes per token at 16-bit, whole model, all layers: 2 x layers x kv_heads x head_dim x
# 2 bytes (MLA: layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes, no factor 2).
BF16_BYTES_PER_TOKEN = {
    "llama-2-7b": 2 * 32 * 32 * 128 * 2,
    "llama-2-13b": 819_200,
    "llama-2-70b": 2 * 80 * 8 * 128 * 2,
    "llama-3.1-8b": 131_072,
    "llama-3.1-70b": 327_680,
    "llama-3.1-405b": 2 * 126 * 8 * 128 * 2,
    "mistral-7b": 131_072,
    "mixtral-8x7b": 131_072,
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,
    "qwen2.5-72b": 327_680,
    "qwen3-8b": 2 * 36 * 8 * 128 * 2,
    "qwen3-32b": 2 * 64 * 8 * 128 * 2,
    "gemma-2-9b": 2 * 42 * 8 * 256 * 2,
    "gemma-3-27b": 2 * 62 * 16 * 128 * 2,
    "phi-3-mini": 2 * 32 * 32 * 96 * 2,
    "deepseek-v3": 61 * (512 + 64) * 2,
}


def tiny(
    layers: int, kv_heads: int, head_dim: int, dtype: str = "float32", heads: int | None = None
) -> ModelArch:
    """A tiny Llama like the one kvscope builds for the CPU engine."""
    heads = heads or kv_heads
    return from_config_dict(
        {
            "model_type": "llama",
            "hidden_size": heads * head_dim,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "intermediate_size": 4 * heads * head_dim,
            "vocab_size": 1024,
            "max_position_embeddings": 4096,
            "torch_dtype": dtype,
        }
    )


@pytest.mark.parametrize(("name", "expected"), sorted(BF16_BYTES_PER_TOKEN.items()))
def test_bytes_per_token_at_16_bit(name: str, expected: int) -> None:
    assert kv_bytes_per_token(load_preset(name), "bfloat16") == expected


def test_issue_figures() -> None:
    assert kv_bytes_per_token(load_preset("llama-2-13b"), "float16") == 819_200
    assert kv_bytes_per_token(load_preset("llama-3.1-8b"), "bfloat16") == 131_072
    assert kv_bytes_per_token(load_preset("deepseek-v3"), "bfloat16") == 70_272


@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_vllm_cpu_data_point(block_size: int) -> None:
    # VLLM_METRICS.md: 2 layers, 2 KV heads, head_dim 32, float32, 1 GiB -> 1,048,576 tokens.
    layout = vllm_kv_cache(tiny(2, 2, 32), GIB, block_size, model_dtype="float32")
    assert layout.page_bytes == 2 * block_size * 2 * 32 * 4
    assert layout.num_blocks == GIB // (layout.page_bytes * 2)
    assert layout.capacity_tokens == 1_048_576


@pytest.mark.parametrize(
    ("layers", "kv_heads", "head_dim", "dtype", "heads"),
    [(3, 3, 32, "float32", 3), (2, 1, 64, "bfloat16", 4), (4, 2, 16, "float32", 8)],
)
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("kv_bytes", [GIB, 3 * GIB // 2, 123_456_789])
def test_tiny_shapes_follow_the_block_formula(
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype: str,
    heads: int,
    block_size: int,
    kv_bytes: int,
) -> None:
    arch = tiny(layers, kv_heads, head_dim, dtype, heads)
    layout = vllm_kv_cache(arch, kv_bytes, block_size, model_dtype=dtype)
    elem = 4 if dtype == "float32" else 2
    page = 2 * block_size * kv_heads * head_dim * elem
    assert layout.num_blocks == kv_bytes // page // layers
    assert layout.capacity_tokens == layout.num_blocks * block_size
    per_request = math.ceil(4096 / block_size)
    assert layout.max_concurrency == pytest.approx(layout.num_blocks / per_request)


def test_kv_follows_the_served_dtype() -> None:
    arch = tiny(2, 2, 32)
    # --dtype auto serves a float32 checkpoint in bf16, so the KV is 2-byte...
    assert vllm_kv_cache(arch, GIB, 16).capacity_tokens == 2 * 1_048_576
    # ...unless the engine runs in float32 (the CPU engine's --dtype float32).
    assert vllm_kv_cache(arch, GIB, 16, model_dtype="float32").capacity_tokens == 1_048_576


def test_mla_has_no_factor_two() -> None:
    ds = load_preset("deepseek-v3")
    assert token_bytes_per_layer(ds, "bfloat16") == 576 * 2
    assert page_bytes(ds, "bfloat16", 64) == 64 * 576 * 2
    assert kv_bytes_per_token(ds, "fp8") == 61 * 576
    assert kv_bytes_per_token(ds, "fp8_ds_mla") == 61 * 656
    assert default_block_size(ds) == 64
    # The latent is replicated on every TP rank, not split.
    assert kv_bytes_per_token(ds, "bfloat16", tp=8) == 70_272


def test_quantized_kv_layouts() -> None:
    arch = load_preset("llama-3.1-8b")
    per_layer_heads = 8 * 2  # K and V of 8 heads
    assert token_bytes_per_layer(arch, "fp8") == per_layer_heads * 128
    assert token_bytes_per_layer(arch, "int8") == per_layer_heads * (128 + 4)
    assert token_bytes_per_layer(arch, "int4") == per_layer_heads * (64 + 4)
    assert token_bytes_per_layer(arch, "nvfp4") == per_layer_heads * (64 + 8)
    assert kv_bytes_per_token(arch, "fp8") * 2 == kv_bytes_per_token(arch, "bfloat16")


def test_tensor_parallel_splits_and_replicates_kv_heads() -> None:
    arch = load_preset("llama-3.1-70b")
    assert [kv_heads_per_rank(arch, tp) for tp in (1, 2, 4, 8, 16, 32)] == [8, 4, 2, 1, 1, 1]
    assert kv_bytes_per_token(arch, "bfloat16", tp=4) == 327_680 // 4


def test_kv_dtype_names() -> None:
    ds, llama = load_preset("deepseek-v3"), load_preset("llama-3.1-8b")
    assert resolve_kv_dtype("fp8_e4m3", llama) == "fp8"
    assert resolve_kv_dtype("auto", llama) == "bfloat16"
    with pytest.raises(InvalidInput, match="not available for MLA"):
        resolve_kv_dtype("int8", ds)
    with pytest.raises(InvalidInput, match="only for MLA"):
        resolve_kv_dtype("fp8_ds_mla", llama)
    with pytest.raises(UnknownChoice, match="valid choices"):
        resolve_kv_dtype("fp7", llama)


def test_hybrid_groups_match_vllm() -> None:
    gemma2 = kv_groups(load_preset("gemma-2-9b"))
    assert sorted(len(g.layers) for g in gemma2) == [21, 21]
    gemma3 = kv_groups(load_preset("gemma-3-27b"))
    full = [g for g in gemma3 if g.window is None]
    sliding = [g for g in gemma3 if g.window == 1024]
    assert [len(g.layers) for g in full] == [10]
    assert sorted(len(g.layers) for g in sliding) == [8, 8, 9, 9, 9, 9]
    # vLLM assigns layers[i::num_groups] so a pipeline split keeps groups balanced.
    assert sliding[0].layers[:2] == (0, 7)
    assert len(kv_groups(load_preset("llama-3.1-8b"))) == 1


def test_hybrid_token_capacity_divides_by_groups() -> None:
    arch = load_preset("gemma-3-27b")
    layout = vllm_kv_cache(arch, 20 * GIB, 16)
    assert layout.group_size == 10 and layout.num_groups == 7
    assert layout.num_blocks == 20 * GIB // layout.page_bytes // 10
    assert layout.capacity_tokens == layout.num_blocks // 7 * 16


def test_sliding_window_request_reservation() -> None:
    arch = load_preset("mistral-7b")
    groups = kv_groups(arch)
    # min(window - 1 + max_num_batched_tokens, max_model_len) tokens + 1 block.
    assert blocks_per_request(groups, 32768, 16, 8192) == math.ceil((4095 + 8192) / 16) + 1
    assert blocks_per_request(groups, 1000, 16, 8192) == math.ceil(1000 / 16) + 1
    assert blocks_per_request(groups, 1000, 16, 8192, capped=True) == math.ceil(1000 / 16)


@pytest.mark.parametrize("name", ["gemma-2-9b", "gemma-3-27b", "mistral-7b", "llama-3.1-8b"])
@pytest.mark.parametrize("capped", [False, True])
def test_vectorised_blocks_match_scalar(name: str, capped: bool) -> None:
    groups = kv_groups(load_preset(name))
    contexts = [1, 15, 16, 17, 1000, 4095, 4096, 4097, 12_000, 40_000, 131_072]
    array = blocks_per_request_array(groups, contexts, 16, 2048, capped=capped)
    scalar = [blocks_per_request(groups, c, 16, 2048, capped=capped) for c in contexts]
    assert array.tolist() == scalar
    assert np.all(np.diff(array) >= 0)


def test_sequence_bytes_rounds_to_blocks_and_applies_windows() -> None:
    llama = load_preset("llama-3.1-8b")
    assert sequence_bytes(llama, "bfloat16", 100, 16) == 112 * 131_072
    gemma = load_preset("gemma-2-9b")
    short, long = (sequence_bytes(gemma, "bfloat16", n, 16, 512) for n in (4000, 8192))
    assert short == 250 * 16 * 344_064  # below the window: every layer holds all tokens
    # Past the window a local layer keeps window - 1 + 512 tokens (+1 block); only the 21
    # global layers grow with the context.
    per_layer = 344_064 // 42
    local = 21 * (math.ceil((4095 + 512) / 16) + 1) * 16 * per_layer
    assert long == local + 21 * 8192 * per_layer
    # With vLLM's default 8192-token prefill chunk the whole 8K prompt is in the window
    # while it is prefilled, so nothing is saved at 8K.
    assert sequence_bytes(gemma, "bfloat16", 8192, 16) == 8192 * 344_064


def test_pipeline_partition_like_vllm() -> None:
    assert [len(r) for r in pp_partition(80, 3)] == [27, 27, 26]
    assert [len(r) for r in pp_partition(61, 4)] == [15, 15, 16, 15]
    assert [len(r) for r in pp_partition(32, 2)] == [16, 16]
    with pytest.raises(InvalidInput, match="between 1 and the layer count"):
        pp_partition(32, 33)


def test_negative_budget_is_refused() -> None:
    with pytest.raises(InvalidInput):
        vllm_kv_cache(tiny(2, 2, 32), -1)
