"""Engine specs render to the exact vllm serve argv and refuse what cannot start."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from planner.errors import InvalidInput
from probes.engine.spec import (
    ENTRY,
    embedded_spec,
    engine_config,
    mask_command,
    parse_spec,
    preflight,
    spec_differences,
)
from storage.settings import Settings


def _base(tmp_path: Path) -> dict[str, object]:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return {
        "name": "e1",
        "model": str(model),
        "python": str(python),
        "port": 8765,
        "kv_cache_memory_bytes": 16 << 20,
        "block_size": 32,
    }


def test_argv_and_environment(tmp_path: Path) -> None:
    spec = parse_spec(
        _base(tmp_path)
        | {
            "max_model_len": 4096,
            "enable_prefix_caching": False,
            "kv_cache_dtype": "fp8",
            "enforce_eager": True,
            "extra_args": ["--seed", "1"],
        }
    )
    argv = spec.argv()
    assert argv[:4] == [str(tmp_path / "python"), str(ENTRY), "serve", str(tmp_path / "model")]
    joined = " ".join(argv)
    for part in (
        "--served-model-name model",
        "--port 8765",
        "--max-model-len 4096",
        "--kv-cache-memory-bytes 16777216",
        "--block-size 32",
        "--kv-cache-dtype fp8",
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--seed 1",
    ):
        assert part in joined
    env = spec.environment(tmp_path / "run")
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["HF_HUB_OFFLINE"] == "1"
    assert env["TMPDIR"] == str(tmp_path / "run" / "tmp")
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))
    assert spec.command_line(tmp_path / "run").startswith("env HF_HUB_OFFLINE=1 ")


def test_a_vllm_executable_instead_of_python(tmp_path: Path) -> None:
    spec = parse_spec(
        _base(tmp_path)
        | {
            "python": None,
            "vllm": "/usr/bin/vllm",
            "device": "cuda",
            "kv_cache_memory_bytes": None,
            "gpu_memory_utilization": 0.85,
            "block_size": 16,
        }
    )
    assert spec.argv()[:2] == ["/usr/bin/vllm", "serve"]
    assert "--gpu-memory-utilization 0.85" in " ".join(spec.argv())
    assert "VLLM_TARGET_DEVICE" not in spec.environment(tmp_path)
    assert "OMP_NUM_THREADS" not in spec.environment(tmp_path)


@pytest.mark.parametrize(("cores", "threads"), [(1, "1"), (2, "1"), (16, "15")])
def test_a_cpu_engine_leaves_a_core_to_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, threads: str
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    env = parse_spec(_base(tmp_path)).environment(tmp_path)
    assert env["OMP_NUM_THREADS"] == threads
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


@pytest.mark.parametrize("own", [{"OMP_NUM_THREADS": "2"}, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}])
def test_a_spec_s_own_thread_settings_are_kept_whole(tmp_path: Path, own: dict[str, str]) -> None:
    env = parse_spec(_base(tmp_path) | {"env": own}).environment(tmp_path)
    assert env.items() >= own.items()
    # Half of ours beside half of theirs would be a setting nobody chose.
    assert not ({"OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND"} - own.keys()) & env.keys()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"block_size": 48}, "block_size 48 does not work on CPU"),
        ({"kv_cache_memory_bytes": None}, "needs kv_cache_memory_bytes"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype: Input should be .auto."),
        ({"port": 80}, "port"),
        ({"vllm": "/usr/bin/vllm"}, "either python"),
        ({"name": "no spaces"}, "name must be"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_static_mistakes_are_refused(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_spec(_base(tmp_path) | change)


def test_preflight_finds_what_this_machine_refuses(tmp_path: Path) -> None:
    base = _base(tmp_path)
    assert preflight(parse_spec(base)) == []
    (tmp_path / "model" / "config.json").unlink()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        problems = preflight(parse_spec(base | {"port": port, "python": "/nope/python"}))
    assert any("has no config.json" in p for p in problems)
    assert any(f"port {port} on 127.0.0.1 is already in use" in p for p in problems)
    assert any("'/nope/python' does not exist" in p and "make engine-env" in p for p in problems)


def test_embedded_default(tmp_path: Path) -> None:
    spec = embedded_spec(Settings(data_dir=tmp_path, engine_venv=tmp_path / "venv"))
    assert spec.device == "cpu" and spec.block_size == 32 and spec.dtype == "float32"
    assert spec.kv_cache_memory_bytes == 16 * 1024 * 1024
    assert spec.model == str(tmp_path / "models" / "tiny-llama")
    assert spec.python == str(tmp_path / "venv" / "bin" / "python")
    # One engine process: a separate model worker starves the API server on small machines.
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in spec.command_line(tmp_path / "run")


def test_tmpdir_stays_short_enough_for_vllms_unix_sockets(tmp_path: Path) -> None:
    from probes.engine.spec import engine_tmp_dir

    short = Path("/srv/kv/engines/e1")
    assert engine_tmp_dir(short) == short / "tmp"
    deep = tmp_path / ("x" * 80) / "engines" / "embedded"
    chosen = engine_tmp_dir(deep)
    # vLLM binds ipc sockets at TMPDIR/<36-character uuid>; the path must fit in 107 bytes.
    assert len(f"{chosen}/{'u' * 36}") <= 107
    assert chosen == engine_tmp_dir(deep)  # stable, so stop can wipe it


def test_a_managed_engine_is_reached_with_the_key_its_variable_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_spec(_base(tmp_path) | {"api_key_env": "KVSCOPE_TOKEN_E1"})
    monkeypatch.delenv("KVSCOPE_TOKEN_E1", raising=False)
    assert spec.target.headers == {}  # unset: no key (the engine's 401 says so)
    assert any("$KVSCOPE_TOKEN_E1, which is not set" in p for p in preflight(spec))
    monkeypatch.setenv("KVSCOPE_TOKEN_E1", "k-secret-1")
    assert spec.target.headers == {"Authorization": "Bearer k-secret-1"}
    assert spec.secret_environment(os.environ) == {"VLLM_API_KEY": "k-secret-1"}
    assert preflight(spec) == []
    # Named, never held: not in the stored form, the environment or the command line.
    line = spec.command_line(tmp_path / "run")
    assert 'VLLM_API_KEY="$KVSCOPE_TOKEN_E1"' in line
    assert "k-secret-1" not in line + json.dumps(spec.model_dump()) + str(
        spec.environment(tmp_path)
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"env": {"VLLM_API_KEY": "k3"}}, "VLLM_API_KEY: looks like a secret"),
        ({"env": {"HF_TOKEN": "hf_x"}}, "HF_TOKEN: looks like a secret"),
        ({"extra_args": ["--api-key", "k1"]}, "--api-key: a secret on the command line"),
        ({"extra_args": ["--api-key=k2"]}, "--api-key: a secret on the command line"),
        ({"env": {"OMP_PLACES": "hf_" + "a" * 30}}, "OMP_PLACES: its value looks like a token"),
        ({"api_key_env": "VLLM_API_KEY"}, "must name a variable KVSCOPE_TOKEN_"),
        ({"api_key_env": "k3y-itself"}, "the secret itself is never stored"),
    ],
)
def test_a_secret_is_never_a_value_not_even_for_the_owner(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    base = _base(tmp_path)
    for unsafe in (False, True):
        with pytest.raises(InvalidInput, match=message):
            parse_spec(base | change | {"allow_unsafe": unsafe})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"env": {"LD_PRELOAD": "./evil.so"}}, "LD_PRELOAD: the dynamic linker loads code"),
        ({"env": {"BROWSER": "sh"}}, "BROWSER: Python's webbrowser module runs it"),
        ({"env": {"PYTHONWARNINGS": "ignore"}}, "PYTHONWARNINGS: it changes what the engine"),
        ({"env": {"HF_HUB_OFFLINE": "0"}}, "HF_HUB_OFFLINE: kvscope sets it"),
        ({"env": {"OMP_TOOL_LIBRARIES": "x.so"}}, "OMP_TOOL_LIBRARIES: OpenMP loads"),
        ({"env": {"NOTE": "x"}}, "NOTE: not on the allowlist"),
        ({"extra_args": ["--middleware", "evil.M"]}, "--middleware: it imports and runs"),
        ({"extra_args": ["--frobnicate"]}, "--frobnicate: not a vllm serve flag kvscope knows"),
        ({"extra_args": ["--no-disable-log-stats"]}, "--no-disable-log-stats: not a vllm serve"),
    ],
)
def test_what_is_off_the_allowlists_takes_allow_unsafe(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    base = _base(tmp_path)
    with pytest.raises(InvalidInput, match=f"{message}.*only the machine's owner, with --allow"):
        parse_spec(base | change)
    spec = parse_spec(base | change | {"allow_unsafe": True})
    assert len(spec.unsafe_items) == 1 and spec.allow_unsafe


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "x"], "--seed: wants a whole number"),
        (["--seed", "-1"], "--seed: needs a value"),
        (["--scheduling-policy", "lifo"], "--scheduling-policy: wants one of fcfs, priority"),
        (["--disable-log-stats", "yes"], "--disable-log-stats: is a switch and takes no value"),
        (["--seed", "1", "--seed=2"], "--seed: is given twice"),
        (["--host", "0.0.0.0"], r"--host: has a field of its own: set host \(--set host="),
        (["--port=9000"], "--port: has a field of its own"),
        (["serve"], "serve: is not a --flag"),
        (["--chat-template", "rel/path.jinja"], "--chat-template: wants an absolute path"),
    ],
)
def test_extra_arguments_are_known_flags_with_typed_values(
    tmp_path: Path, args: list[str], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_spec(_base(tmp_path) | {"extra_args": args, "allow_unsafe": True})


def test_known_flags_and_allowlisted_variables_render_as_given(tmp_path: Path) -> None:
    args = ["--seed=3", "--async-scheduling", "--no-enable-log-requests", "--trust-remote-code"]
    env = {"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "0,1", "HF_HOME": str(tmp_path / "hf")}
    spec = parse_spec(_base(tmp_path) | {"extra_args": args, "env": env})
    assert spec.argv()[-4:] == args and not spec.unsafe_items
    assert spec.environment(tmp_path / "engines" / "e1").items() >= env.items()
    # Owner's: a flag that runs the model's own code; named for the page, not unsafe.
    assert list(spec.owner_items) == ["--trust-remote-code"]
    # Cache folders must lie under the data directory (checked where it is known).
    assert preflight(spec, data_dir=tmp_path) == []
    assert preflight(spec, data_dir=tmp_path / "other") == [
        f"HF_HOME: {tmp_path / 'hf'} is not under the data directory {tmp_path / 'other'}"
    ]


def test_secrets_are_masked_in_commands_and_differences() -> None:
    line = "env VLLM_API_KEY=abc123 X=1 vllm serve m --api-key sk-1 --hf-token=hf_zz --seed 1"
    masked = mask_command(line)
    assert "abc123" not in masked and "sk-1" not in masked and "hf_zz" not in masked
    assert "--seed 1" in masked and "X=1" in masked
    kept = mask_command('env VLLM_API_KEY="$KVSCOPE_TOKEN_E" vllm serve m')
    assert 'VLLM_API_KEY="$KVSCOPE_TOKEN_E"' in kept
    assert spec_differences({"port": 1, "env": {"HF_TOKEN": "x"}}, {"port": 2, "env": {}}) == [
        "env: {'HF_TOKEN': '••••'} → {}",
        "port: 1 → 2",
    ]


TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 8192,
    "torch_dtype": "float32",
}  # fmt: skip


def test_the_simulator_sees_a_managed_engine_as_the_planner_counts_it(tmp_path: Path) -> None:
    base = _base(tmp_path)
    (Path(str(base["model"])) / "config.json").write_text(json.dumps(TINY))
    base |= {"dtype": "float32", "max_model_len": 4096}
    spec = parse_spec(base | {"max_num_seqs": 8, "max_num_batched_tokens": 512})
    config = engine_config(spec, tmp_path)
    # 16 MiB of float32 KV at 2 layers x 2 KV heads x 64 dims (K and V): 2,048 bytes a
    # token, 8,192 tokens, 256 blocks of 32; one is vLLM's null block.
    assert (config.num_blocks, config.block_size) == (255, 32)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (8, 512)
    assert config.chunked_prefill and config.max_model_len == 4096
    override = engine_config(spec.model_copy(update={"num_gpu_blocks_override": 200}), tmp_path)
    assert override.num_blocks == 199
    # Limits the spec leaves to vLLM come from the engine's own startup log.
    log = tmp_path / "engines" / "e1" / "engine.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        "INFO [arg_utils.py:1] Defaulting max_num_seqs to 128\n"
        "INFO [scheduler.py:1] Chunked prefill is enabled with max_num_batched_tokens=4096.\n"
    )
    logged = engine_config(parse_spec(base), tmp_path)
    assert (logged.max_num_seqs, logged.max_num_batched_tokens) == (128, 4096)
    log.unlink()
    with pytest.raises(InvalidInput, match="neither in its spec nor in its startup log"):
        engine_config(parse_spec(base), tmp_path)
    # A CUDA engine sized by gpu_memory_utilization: its blocks are vLLM's to measure.
    gpu = spec.model_copy(update={"device": "cuda", "kv_cache_memory_bytes": None})
    with pytest.raises(InvalidInput, match="no explicit KV size"):
        engine_config(gpu, tmp_path)
