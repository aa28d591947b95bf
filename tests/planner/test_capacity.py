"""Budgets, blocks and what fits: invariants, vLLM's rules, refusals and searches."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from planner.capacity import (
    PlanRequest,
    fits_map,
    oom_frontier,
    plan_capacity,
    plans_by_kv_dtype,
    sequences_at,
    smallest_deployment,
    valid_tp_sizes,
)
from planner.errors import InvalidInput
from planner.gpus import GIB, custom_gpu, get_gpu
from planner.kv import kv_groups, page_bytes
from planner.memory import memory_budget
from planner.models import from_config_dict, load_preset, param_count
from planner.overheads import forward_activation_bytes

JSON_KEYS = {
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "params",
    "weights_bytes",
    "kv_budget_bytes_per_gpu",
    "num_blocks",
    "kv_capacity_tokens",
    "max_concurrency",
    "kv_bytes_per_sequence",
    "fits",
    "breakdown",
}


def request(model: str = "llama-3.1-8b", gpu: str = "h100-sxm", **over: Any) -> PlanRequest:
    base = PlanRequest(model=load_preset(model), gpu=get_gpu(gpu))
    return replace(base, **over)


@pytest.mark.parametrize(
    ("model", "gpu", "gpus"),
    [
        ("llama-2-13b", "a100-40gb", 1),
        ("llama-3.1-8b", "l4", 1),
        ("llama-3.1-70b", "h100-sxm", 4),
        ("mixtral-8x7b", "a100-80gb", 2),
        ("gemma-3-27b", "l40s", 2),
        ("deepseek-v3", "h200", 8),
        ("qwen3-32b", "mi300x", 1),
    ],
)
def test_blocks_are_the_budget_floor_divided(model: str, gpu: str, gpus: int) -> None:
    plan = plan_capacity(request(model, gpu, num_gpus=gpus))
    budget = plan.memory.kv_cache_bytes
    layer_bytes = plan.page_bytes * plan.group_size
    assert plan.num_blocks == budget // layer_bytes
    assert plan.num_blocks * layer_bytes <= budget < (plan.num_blocks + 1) * layer_bytes
    assert plan.kv_capacity_tokens == plan.num_blocks // len(plan.groups) * plan.block_size
    assert sum(plan.breakdown().values()) == plan.memory.total_bytes
    assert plan.to_dict().keys() >= JSON_KEYS


def test_budget_is_utilization_minus_weights_and_overheads() -> None:
    plan = plan_capacity(request())
    m = plan.memory
    assert m.total_bytes == round(79.19 * GIB)
    assert m.budget_bytes == int(m.total_bytes * 0.92)  # the newest releases' default
    assert m.kv_cache_bytes == m.budget_bytes - m.weights_bytes - m.overhead_bytes
    assert m.weights_bytes == 2 * param_count(load_preset("llama-3.1-8b")).total
    old = plan_capacity(request(vllm_version="0.19.0")).memory
    assert old.budget_bytes == int(m.total_bytes * 0.9) and old.cuda_graph_bytes == 0
    # H100's defaults: 8,192 batched tokens, 1,024 sequences (an A100: 2,048 and 256).
    assert (plan.max_num_batched_tokens, plan.max_num_seqs) == (8192, 1024)
    a100 = plan_capacity(request(gpu="a100-80gb"))
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)


def test_unsure_plans_are_the_low_end_of_a_range() -> None:
    newest = plan_capacity(request())  # 0.20+: graphs in the budget, no log checks it
    low, high = newest.kv_capacity_range
    assert newest.unsure and low < high and low == newest.kv_capacity_tokens
    assert any("unsure" in n for n in newest.notes)
    known = plan_capacity(request(vllm_version="0.19.0"))
    assert not known.unsure and known.kv_capacity_range[0] == known.kv_capacity_range[1]
    assert low < known.kv_capacity_tokens  # the safe side: graphs counted, margins
    unknown = plan_capacity(request(vllm_version="0.4.2"))
    assert unknown.unsure and "no accounting" in unknown.unsure[0]
    assert unknown.kv_capacity_range[0] < known.kv_capacity_tokens < unknown.kv_capacity_range[1]
    with pytest.raises(InvalidInput, match="vLLM version"):
        plan_capacity(request(vllm_version="latest"))
    # 0.11-0.16: checked on single-GPU starts only; two replicas of one GPU stay sure.
    assert not plan_capacity(request(vllm_version="0.11.2", num_gpus=2, tp=1)).unsure
    (why,) = plan_capacity(request(vllm_version="0.11.2", num_gpus=2)).unsure
    assert "tensor or pipeline parallelism" in why


def test_overrides_replace_estimates() -> None:
    plan = plan_capacity(
        request(
            activation_bytes=0, non_torch_bytes=0, cuda_graph_bytes=0, gpu_memory_utilization=1.0
        )
    )
    m = plan.memory
    assert m.kv_cache_bytes == m.total_bytes - m.weights_bytes
    eager = plan_capacity(request(enforce_eager=True))
    assert eager.memory.cuda_graph_bytes == 0


def test_explicit_kv_bytes_win_over_utilization() -> None:
    plan = plan_capacity(request(kv_cache_memory_bytes=10 * GIB, gpu_memory_utilization=0.5))
    assert plan.memory.kv_cache_bytes == 10 * GIB and plan.memory.explicit_kv
    assert plan.num_blocks == 10 * GIB // (65_536 * 32)


def test_cpu_engine_case_matches_vllm() -> None:
    # The lead's live check: CPU engine, VLLM_CPU_KVCACHE_SPACE=1, --dtype float32.
    arch = from_config_dict(
        {
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 512,
            "max_position_embeddings": 2048,
            "torch_dtype": "float32",
        }
    )
    plan = plan_capacity(
        PlanRequest(
            model=arch, gpu=None, kv_cache_memory_bytes=GIB, model_dtype="float32", block_size=32
        )
    )
    assert plan.kv_capacity_tokens == 1_048_576
    assert plan.num_blocks == GIB // (page_bytes(arch, "float32", 32) * 2)
    assert plan.max_concurrency == pytest.approx(plan.num_blocks / (2048 / 32))
    assert plan.memory.cuda_graph_bytes == 0


def test_cpu_without_kv_size_is_refused() -> None:
    with pytest.raises(InvalidInput, match="kv-memory-bytes"):
        plan_capacity(PlanRequest(model=load_preset("llama-3.1-8b")))


def test_model_that_does_not_fit() -> None:
    plan = plan_capacity(request("llama-3.1-70b", "a100-80gb"))
    assert plan.num_blocks == 0 and not plan.fits and not plan.startup_ok
    assert plan.max_sequences == 0
    assert any("No available memory" in note for note in plan.notes)


def test_vllm_refuses_when_max_len_request_does_not_fit() -> None:
    plan = plan_capacity(request("llama-3.1-8b", "l4"))
    assert plan.num_blocks > 0 and not plan.startup_ok
    assert any("--max-model-len" in note for note in plan.notes)
    assert plan_capacity(request("llama-3.1-8b", "l4", max_model_len=8192)).startup_ok


def test_fits_is_exactly_max_sequences() -> None:
    plan = plan_capacity(request(context=8192))
    n = plan.max_sequences
    assert n == (plan.num_blocks - 1) // 512  # one block is vLLM's null block
    assert plan_capacity(request(context=8192, batch=n)).fits
    assert not plan_capacity(request(context=8192, batch=n + 1)).fits


def test_concurrency_is_vllms_figure() -> None:
    plan = plan_capacity(request())
    assert plan.max_concurrency_at_max_len == pytest.approx(plan.num_blocks / (131072 / 16))
    assert plan.max_concurrency == plan.max_concurrency_at_max_len  # context defaults to it


def test_fp8_halves_kv_and_doubles_blocks() -> None:
    plans = plans_by_kv_dtype(request(context=8192), ["auto", "fp8", "int8", "int4"])
    bf16, fp8 = plans["bfloat16"], plans["fp8"]
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.num_blocks in (2 * bf16.num_blocks, 2 * bf16.num_blocks + 1)
    assert plans["int4"].kv_capacity_tokens > plans["int8"].kv_capacity_tokens
    mla = plans_by_kv_dtype(request("deepseek-v3", "h200", num_gpus=8), ["auto", "int8", "fp8"])
    assert set(mla) == {"bfloat16", "fp8"}  # int8 is skipped for MLA


def test_fits_map_and_frontier_agree() -> None:
    plan = plan_capacity(request("gemma-2-9b", "l40s", context=2048))
    contexts = np.linspace(256, plan.max_model_len, 64).astype(np.int64)
    batches = np.arange(1, 65)
    grid = fits_map(plan, contexts, batches)
    assert grid.fits.shape == (64, 64)
    for i, b in enumerate(batches):
        limit = grid.frontier[i]
        assert (grid.fits[i] == (contexts <= limit)).all()
        if limit:
            assert sequences_at(plan, [limit])[0] >= b
        if limit < plan.max_model_len:
            assert sequences_at(plan, [limit + 1])[0] < b
    assert (np.diff(grid.frontier) <= 0).all()


def test_frontier_is_zero_when_nothing_fits() -> None:
    plan = plan_capacity(request("llama-3.1-70b", "a100-80gb"))
    assert oom_frontier(plan, [1, 2]).tolist() == [0, 0]


@pytest.mark.parametrize(("tp", "fragment"), [(3, "does not divide the 40 attention heads")])
def test_bad_tp_is_refused_with_choices(tp: int, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        plan_capacity(request("llama-2-13b", "a100-40gb", num_gpus=3, tp=tp))
    message = str(info.value)
    assert fragment in message and "valid tp sizes: 1, 2, 4, 5, 8, 10, 20, 40" in message


def test_tp_that_splits_kv_heads_unevenly_is_refused() -> None:
    arch = from_config_dict(
        {
            "model_type": "llama",
            "hidden_size": 768,
            "num_hidden_layers": 2,
            "num_attention_heads": 12,
            "num_key_value_heads": 4,
            "intermediate_size": 64,
            "vocab_size": 64,
            "max_position_embeddings": 128,
        }
    )
    assert valid_tp_sizes(arch) == [1, 2, 4, 12]
    with pytest.raises(InvalidInput, match="KV heads evenly"):
        plan_capacity(PlanRequest(model=arch, gpu=custom_gpu(16), num_gpus=6))


@pytest.mark.parametrize(
    ("over", "fragment"),
    [
        ({"context": 200_000}, "above the max model length"),
        ({"max_model_len": 200_000}, "above the model's maximum"),
        ({"block_size": 48}, "valid choices: 1, 8, 16"),
        ({"num_gpus": 3, "tp": 2}, "multiple of 2"),
        ({"num_gpus": 4, "pp": 3}, "does not divide the 4 GPUs"),
        ({"batch": 0}, "at least 1"),
        ({"gpu_memory_utilization": 1.5}, "(0, 1]"),
        ({"kv_dtype": "fp9"}, "valid choices"),
        ({"weights_dtype": "int3"}, "valid choices"),
    ],
)
def test_impossible_requests_are_refused(over: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        plan_capacity(request(**over))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_tensor_parallel_shrinks_weights_and_kv_per_gpu() -> None:
    one = plan_capacity(request("llama-3.1-70b", "h100-sxm", num_gpus=2))
    four = plan_capacity(request("llama-3.1-70b", "h100-sxm", num_gpus=4))
    assert four.weights_bytes_per_gpu < one.weights_bytes_per_gpu
    assert four.kv_bytes_per_token_per_gpu * 2 == one.kv_bytes_per_token_per_gpu
    assert four.kv_capacity_tokens > 2 * one.kv_capacity_tokens


def test_pipeline_parallel_uses_the_tightest_stage() -> None:
    plan = plan_capacity(request("llama-3.1-70b", "h100-sxm", num_gpus=4, pp=4, tp=1))
    assert plan.pp == 4 and plan.tp == 1
    assert plan.group_size == 20 and plan.kv_bytes_per_token_per_gpu == 327_680 // 4
    assert plan.weights_bytes_per_gpu < plan.weights_bytes / 3


def test_replicas_multiply_sequences() -> None:
    plan = plan_capacity(request(num_gpus=4, tp=1, context=8192))
    assert plan.replicas == 4
    assert plan.to_dict()["replicas"] == 4


def test_smallest_deployment_is_minimal() -> None:
    req = request("llama-3.1-70b", "h100-sxm")
    best = smallest_deployment(req, context=8192, concurrency=64)
    assert best.sequences >= 64
    assert best.num_gpus * 1 == best.tp * best.pp * best.replicas
    for n in range(1, best.num_gpus):
        for tp in valid_tp_sizes(req.model, 8):
            if n % tp:
                continue
            try:
                plan = plan_capacity(
                    replace(req, num_gpus=n, tp=tp, max_model_len=8192, context=8192)
                )
            except InvalidInput:
                continue
            assert plan.max_sequences * plan.replicas < 64 or not plan.startup_ok


def test_smallest_deployment_reports_impossible_targets() -> None:
    with pytest.raises(InvalidInput, match="no deployment"):
        smallest_deployment(request("llama-3.1-405b", "l4"), 131072, 1000, max_gpus=4)


def test_activation_estimate_grows_with_chunk() -> None:
    arch = load_preset("llama-3.1-8b")
    small = forward_activation_bytes(arch, "bfloat16", 1, max_num_batched_tokens=2048)
    large = forward_activation_bytes(arch, "bfloat16", 1, max_num_batched_tokens=8192)
    assert 0 < small < large < 2 * GIB


def test_memory_budget_needs_a_device_or_a_size() -> None:
    with pytest.raises(InvalidInput, match="no device memory"):
        memory_budget(0, 1, 0, 0, 0, 0.9)
    assert memory_budget(0, 1, 0, 0, 0, 0.9, kv_cache_memory_bytes=5).kv_cache_bytes == 5
    assert len(kv_groups(load_preset("phi-3-mini"))) == 1
