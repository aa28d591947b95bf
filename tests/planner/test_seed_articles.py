"""The seed articles' figures as docs/planner.md recomputes them; the doc quotes these."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from planner.capacity import PlanRequest, plan_capacity
from planner.fragmentation import fragmentation, output_lengths
from planner.gpus import GIB, get_gpu
from planner.kv import kv_bytes_per_token
from planner.models import attention_variants, load_preset, weight_bytes


def thirteen_b(context: int, **over: Any) -> PlanRequest:
    base = PlanRequest(
        model=load_preset("llama-2-13b"), gpu=get_gpu("a100-40gb"), vllm_version="0.19.0"
    )
    return replace(base, context=context, **over)


def test_13b_on_a100_40gb() -> None:
    arch = load_preset("llama-2-13b")
    assert weight_bytes(arch) == 26_031_728_640
    per_token = kv_bytes_per_token(arch, "float16")
    assert per_token == 819_200 and per_token / (1 << 20) == 0.78125
    # The article's own arithmetic: 14 GiB / (1 MiB x context).
    assert (14 * 1024 // 512, 14 * 1024 // 2048) == (28, 7)
    # Exact bytes per token, 14 GiB of KV: 35 and 8 sequences.
    assert [
        plan_capacity(thirteen_b(c, kv_cache_memory_bytes=14 * GIB)).max_sequences
        for c in (512, 2048)
    ] == [35, 8]
    # What vLLM 0.19 gets on an A100 40GB: 10.86 GiB, 889 blocks, 27 and 6 sequences.
    real = [plan_capacity(thirteen_b(c)) for c in (512, 2048)]
    assert round(real[0].memory.kv_cache_bytes / GIB, 2) == 10.86
    assert real[0].num_blocks == 889
    assert [p.max_sequences for p in real] == [27, 6]
    assert round(real[1].max_concurrency, 2) == 6.95


def test_70b_mha_vs_gqa() -> None:
    variants = attention_variants(load_preset("llama-3.1-70b"))
    mha = kv_bytes_per_token(variants["MHA (64 KV heads)"], "bfloat16")
    gqa = kv_bytes_per_token(variants["GQA (8 KV heads)"], "bfloat16")
    assert mha * 8192 == 20 * GIB
    assert gqa * 8192 == 2.5 * GIB and round(gqa * 8192 / 1e9, 2) == 2.68
    assert gqa * 32768 == 10 * GIB
    assert gqa == kv_bytes_per_token(load_preset("llama-2-70b"), "float16")


def test_fp8_halves_kv() -> None:
    base = PlanRequest(
        model=load_preset("llama-3.1-8b"),
        gpu=get_gpu("h100-sxm"),
        context=8192,
        vllm_version="0.19",
    )
    bf16 = plan_capacity(base)
    fp8 = plan_capacity(replace(base, kv_dtype="fp8"))
    assert (bf16.kv_bytes_per_token, fp8.kv_bytes_per_token) == (131_072, 65_536)
    assert (bf16.num_blocks, fp8.num_blocks) == (27_710, 55_421)
    assert (bf16.kv_capacity_tokens, fp8.kv_capacity_tokens) == (443_360, 886_736)
    assert (bf16.max_sequences, fp8.max_sequences) == (54, 108)
    int8 = plan_capacity(replace(base, kv_dtype="int8"))
    assert int8.kv_bytes_per_token == 67_584
    assert round(int8.kv_bytes_per_token / bf16.kv_bytes_per_token * 100, 1) == 51.6


@pytest.mark.parametrize(
    ("kind", "contiguous", "paged"),
    [("fixed", 68.7, 1.16), ("exponential", 62.7, 0.98), ("lognormal", 61.6, 0.96)],
)
def test_fragmentation_figures(kind: str, contiguous: float, paged: float) -> None:
    result = fragmentation(512, output_lengths(kind, 256, 1536), 2048, 16)
    assert round(result.contiguous_waste * 100, 1) == contiguous
    assert round(result.paged_waste * 100, 2) == paged
    pure = fragmentation(0, output_lengths("exponential", 256, 2048), 2048, 16)
    assert (round(pure.contiguous_waste * 100, 1), round(pure.paged_waste * 100, 1)) == (87.5, 2.9)


def test_13b_batch_16_at_4k_cannot_fit_in_6_to_11_gb() -> None:
    arch = load_preset("llama-2-13b")
    fp16, fp8 = kv_bytes_per_token(arch, "float16"), kv_bytes_per_token(arch, "fp8")
    assert (fp16, fp8) == (819_200, 409_600)
    assert 16 * 4096 * fp16 == 53_687_091_200 == 50 * GIB
    assert 16 * 4096 * fp8 == 25 * GIB
    assert round(11e9 / (4096 * fp16), 1) == 3.3  # what 11 GB holds: about 3 such sequences
    plan = plan_capacity(thirteen_b(4096, batch=16))
    assert not plan.fits and plan.max_sequences < 16
