"""Plans from a startup log: the deployment it describes, measured against predicted, and
re-plans from the measured overheads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.errors import InvalidInput
from planner.gpus import GIB, get_gpu
from planner.measured import request_from_log, study_log
from planner.models import from_config_dict, load_preset
from probes.vllm.logparse import StartupReport, read_startup

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CPU_LOG = FIXTURES / "logs" / "vllm_cpu_0.32.0_startup.log"
QWEN_72B = FIXTURES / "vllm_startup_logs" / "h100-0.19.0-qwen2.5-72b-tp2.log"


def report(path: Path) -> StartupReport:
    return read_startup(path.read_text().splitlines())


def test_the_cpu_engine_log_is_planned_to_the_token() -> None:
    # The embedded engine's model: 2 layers, 2 KV heads of 32, float32 (tinymodel.py).
    tiny = from_config_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "intermediate_size": 256,
            "vocab_size": 4096,
            "max_position_embeddings": 8192,
            "torch_dtype": "float32",
        },
        name="tiny-llama",
    )
    study = study_log(report(CPU_LOG), tiny, None)
    assert study.request.gpu is None and study.request.kv_cache_memory_bytes == GIB // 4
    tokens = {ln.name: ln for ln in study.lines}["KV tokens"]
    assert tokens.measured == tokens.predicted == 262_144
    assert study.replans == []  # nothing measured to re-plan from on a CPU engine


def test_a_replan_from_the_measured_overheads_reproduces_the_log() -> None:
    facts = report(QWEN_72B)
    study = study_log(facts, load_preset("qwen2.5-72b"), get_gpu("h100-sxm"))
    lines = {ln.name: ln for ln in study.lines}
    budget = study.predicted.memory.budget_bytes
    assert lines["all overheads"].measured == budget - round(67.8 * GIB) - round(3.04 * GIB)
    assert lines["KV budget"].measured == round(3.04 * GIB)
    same, fp8 = study.replans
    assert abs(same.kv_capacity_tokens - 19_920) <= same.block_size
    assert fp8.kv_dtype == "fp8" and fp8.kv_capacity_tokens >= 2 * same.kv_capacity_tokens - 16
    # Fewer sequences: a smaller sampler warm-up, more KV (by the predicted difference).
    fewer = study_log(facts, load_preset("qwen2.5-72b"), get_gpu("h100-sxm"), max_num_seqs=256)
    assert fewer.replans[0].kv_capacity_tokens > same.kv_capacity_tokens


def test_the_printed_total_wins_over_the_catalog() -> None:
    facts = report(QWEN_72B)
    gpu = replace(get_gpu("h100-sxm"), visible_bytes=80 * GIB)
    request = request_from_log(facts, load_preset("qwen2.5-72b"), gpu)
    assert request.gpu is not None and request.gpu.visible_bytes == round(79.19 * GIB)
    assert (request.tp, request.gpu_memory_utilization, request.vllm_version) == (2, 0.95, "0.19.0")


def test_a_log_without_total_or_kv_lines_is_refused() -> None:
    facts = replace(report(QWEN_72B), total_gib=None)
    with pytest.raises(InvalidInput, match="name the GPU"):
        request_from_log(facts, load_preset("qwen2.5-72b"), None)
    with pytest.raises(InvalidInput, match="no vLLM KV cache lines"):
        study_log(StartupReport(), load_preset("qwen2.5-72b"), get_gpu("h100-sxm"))
