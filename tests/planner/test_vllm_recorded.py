"""The planner against what vLLM 0.32 on CPU itself reported for several tiny models.

tests/fixtures/vllm_cpu_kv_sizing.json holds the engine's own numbers (startup log and
`vllm:cache_config_info`) for different layers, KV heads, head dims, dtypes, block sizes and
KV spaces; the planner must predict each to the block. The live check against a running
engine is in tests/e2e/test_engine.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from planner.kv import vllm_kv_cache
from planner.models import from_config_dict

ROWS = [
    r
    for r in json.loads(
        (Path(__file__).resolve().parents[1] / "fixtures" / "vllm_cpu_kv_sizing.json").read_text()
    )
    if r["num_gpu_blocks_override"] is None
]


def tiny_config(m: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": m["hidden"],
        "num_hidden_layers": m["layers"],
        "num_attention_heads": m["heads"],
        "num_key_value_heads": m["kv_heads"],
        "head_dim": m["head_dim"],
        "intermediate_size": 4 * m["hidden"],
        "vocab_size": m["vocab"],
        "max_position_embeddings": m["max_pos"],
        "torch_dtype": m["checkpoint_dtype"],
        "tie_word_embeddings": False,
    }


def _id(r: dict[str, Any]) -> str:
    m = r["model"]
    return (
        f"L{m['layers']}-kv{m['kv_heads']}-hd{m['head_dim']}-{r['served_dtype']}-"
        f"{r['kv_cache_dtype_arg']}-bs{r['block_size']}-len{r['max_model_len']}"
    )


@pytest.mark.parametrize("row", ROWS, ids=[_id(r) for r in ROWS])
def test_planner_predicts_what_vllm_allocated(row: dict[str, Any]) -> None:
    arch = from_config_dict(tiny_config(row["model"]), name="tiny")
    layout = vllm_kv_cache(
        arch,
        row["kv_cache_memory_bytes"],
        row["block_size"],
        kv_dtype=row["kv_cache_dtype_arg"],
        model_dtype=row["dtype_arg"],
        max_model_len=row["max_model_len"],
    )
    assert layout.num_blocks == int(row["cache_config_info"]["num_gpu_blocks"])
    assert layout.logged_tokens == row["log_kv_cache_size_tokens"]
    assert round(layout.max_concurrency, 2) == row["log_max_concurrency"]
    assert layout.capacity_tokens == layout.num_blocks * row["block_size"]


def test_logged_tokens_differ_from_block_capacity_when_length_is_not_a_block_multiple() -> None:
    row = next(r for r in ROWS if r["max_model_len"] % r["block_size"])
    arch = from_config_dict(tiny_config(row["model"]), name="tiny")
    layout = vllm_kv_cache(
        arch,
        row["kv_cache_memory_bytes"],
        row["block_size"],
        model_dtype=row["dtype_arg"],
        max_model_len=row["max_model_len"],
    )
    blocks_per_seq = math.ceil(row["max_model_len"] / row["block_size"])
    assert layout.logged_tokens == int(layout.num_blocks / blocks_per_seq * row["max_model_len"])
    assert layout.logged_tokens < layout.capacity_tokens
