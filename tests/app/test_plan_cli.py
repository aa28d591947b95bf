"""`kvscope plan`: JSON keys and figures, the readable table, and one-line refusals (exit 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import app.cli
from app.cli.plan import parse_bytes, plan
from planner.errors import InvalidInput, KvscopeError, UnknownChoice

runner = CliRunner()


def make_app() -> typer.Typer:
    """A Typer app with `plan` registered the way app/cli/__init__.py registers it."""
    cli = typer.Typer(pretty_exceptions_enable=False)

    @cli.callback()
    def _root() -> None:
        """kvscope (test double)."""

    cli.command("plan")(plan)
    return cli


def run_json(*args: str) -> dict[str, object]:
    result = runner.invoke(make_app(), ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.output)
    return data


REQUIRED = {
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


def test_json_has_the_issue_keys_and_published_figures() -> None:
    data = run_json("--model", "llama-2-13b", "--gpu", "a100-40gb", "--context", "512")
    assert data.keys() >= REQUIRED
    assert data["kv_bytes_per_token"] == 819_200
    assert data["params"] == 13_015_864_320
    assert data["weights_bytes"] == 2 * 13_015_864_320
    assert data["kv_bytes_per_sequence"] == 512 * 819_200
    breakdown = data["breakdown"]
    assert isinstance(breakdown, dict) and breakdown["weights"] == 2 * 13_015_864_320


def test_llama_31_8b() -> None:
    data = run_json(
        "-m", "llama-3.1-8b", "-g", "h100-sxm", "--context", "8192", "--batch", "54",
        "--vllm-version", "0.19.0",
    )  # fmt: skip
    assert (data["params"], data["kv_bytes_per_token"]) == (8_030_261_248, 131_072)
    assert data["fits"] is True and data["vllm_accounting"] == "v0.17"
    assert data["kv_capacity_tokens_range"] == [data["kv_capacity_tokens"]] * 2
    newest: Any = run_json("-m", "llama-3.1-8b", "-g", "h100-sxm", "--context", "8192")
    low, high = newest["kv_capacity_tokens_range"]
    assert newest["unsure"] and low == newest["kv_capacity_tokens"] < high
    assert (
        run_json("-m", "llama-3.1-8b", "-g", "h100-sxm", "--context", "8192", "--batch", "10000")[
            "fits"
        ]
        is False
    )


def test_tensor_parallel_and_kv_dtype_flags() -> None:
    data = run_json(
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "h100-sxm",
        "--num-gpus",
        "8",
        "--tp",
        "4",
        "--kv-dtype",
        "fp8",
    )
    assert (data["tp"], data["replicas"], data["kv_dtype"]) == (4, 2, "fp8")
    assert data["kv_bytes_per_token_per_gpu"] == 2 * 80 * 2 * 128  # 2 KV heads per rank, fp8
    assert data["vllm_kv_cache_dtype"] == "fp8"


def test_cpu_engine_from_a_config_path(tmp_path: Path) -> None:
    # The live-engine case: tiny Llama, VLLM_CPU_KVCACHE_SPACE=1 (GiB), --dtype float32.
    config = {
        "architectures": ["LlamaForCausalLM"],
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
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    for block in ("32", "64"):
        data = run_json(
            "--model",
            str(path),
            "--gpu",
            "cpu",
            "--kv-memory-bytes",
            "1GiB",
            "--dtype",
            "float32",
            "--block-size",
            block,
        )
        assert data["kv_capacity_tokens"] == 1_048_576
        assert data["num_blocks"] == (1 << 30) // (2 * int(block) * 2 * 32 * 4 * 2)
        assert data["gpu"] == "cpu"


def test_table_without_json() -> None:
    result = runner.invoke(
        make_app(),
        [
            "plan",
            "--model",
            "deepseek-v3",
            "--gpu",
            "h200",
            "--num-gpus",
            "8",
            "--context",
            "32768",
        ],
    )
    assert result.exit_code == 0, result.output
    text = result.output
    for label in ("KV bytes per token", "KV capacity", "max concurrency", "memory of the"):
        assert label in text
    assert "70,272" in text and "671,026,419,200" in text
    assert not text.lstrip().startswith("{")


@pytest.mark.parametrize(
    ("args", "error", "fragment"),
    [
        (["--model", "llama-9", "--gpu", "h100-sxm"], UnknownChoice, "llama-3.1-8b"),
        (["--model", "llama-3.1-8b", "--gpu", "v100"], UnknownChoice, "h100-sxm"),
        (
            ["--model", "llama-2-13b", "--gpu", "a100-40gb", "--num-gpus", "3"],
            InvalidInput,
            "valid tp sizes: 1, 2, 4, 5, 8, 10, 20, 40",
        ),
        (
            ["--model", "llama-2-13b", "--gpu", "a100-40gb", "--context", "5000"],
            InvalidInput,
            "valid: 1..4096",
        ),
        (["--model", "llama-3.1-8b", "--gpu", "cpu"], InvalidInput, "--kv-memory-bytes"),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--kv-memory-bytes", "lots"],
            InvalidInput,
            "GiB",
        ),
        (
            ["--model", "deepseek-v3", "--gpu", "h200", "--kv-dtype", "int8"],
            InvalidInput,
            "fp8_ds_mla",
        ),
    ],
)
def test_bad_input_raises_one_line_kvscope_errors(
    args: list[str], error: type[KvscopeError], fragment: str
) -> None:
    result = runner.invoke(make_app(), ["plan", *args])
    assert isinstance(result.exception, error), result.output
    message = str(result.exception)
    assert fragment in message and "\n" not in message


def test_malformed_config_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{broken")
    result = runner.invoke(make_app(), ["plan", "--model", str(path), "--gpu", "l4"])
    assert isinstance(result.exception, InvalidInput)
    assert "not valid JSON" in str(result.exception)


def test_main_prints_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(app.cli, "app", make_app())
    monkeypatch.setattr(sys, "argv", ["kvscope", "plan", "--model", "nope", "--gpu", "l4"])
    with pytest.raises(SystemExit) as info:
        app.cli.main()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown model preset 'nope'; valid choices:")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1073741824", 1 << 30),
        ("1GiB", 1 << 30),
        ("1.5 GiB", 3 << 29),
        ("2GB", 2 * 10**9),
        ("512MiB", 1 << 29),
        ("4_096", 4096),
    ],
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_startup_logs"


def test_from_log_compares_and_replans() -> None:
    log = FIXTURE / "h100-0.19.0-qwen2.5-72b-tp2.log"
    data: Any = run_json("-m", "qwen2.5-72b", "-g", "h100-sxm", "--from-log", str(log))
    lines = {ln["name"]: ln for ln in data["lines"]}
    assert lines["KV tokens"]["measured"] == 19_920 and lines["KV tokens"]["unit"] == "tokens"
    assert abs(lines["KV tokens"]["error"]) < 0.05
    assert lines["weights"]["measured"] == round(67.8 * (1 << 30))
    assert data["vllm_version"] == "0.19.0" and "v0.17" in data["accounting"]
    auto, fp8 = data["replans"]
    # Re-planned from what the log measured: the same cache, and FP8 twice the tokens.
    assert abs(auto["kv_capacity_tokens"] - 19_920) <= 16
    assert fp8["kv_capacity_tokens"] >= 2 * auto["kv_capacity_tokens"] - 16


def test_from_log_without_memory_lines_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text("INFO: hello\n")
    for path, message in ((log, "no vLLM KV cache lines"), (tmp_path / "no", "cannot read")):
        result = runner.invoke(
            make_app(), ["plan", "-m", "qwen2.5-7b", "-g", "h100-sxm", "--from-log", str(path)]
        )
        assert isinstance(result.exception, InvalidInput)
        assert message in str(result.exception)
