"""Engine specs render to the exact vllm serve argv and refuse what cannot start."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from planner.errors import InvalidInput
from probes.engine.spec import ENTRY, embedded_spec, parse_spec, preflight
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


@pytest.mark.parametrize(
    ("extra", "env", "key"),
    [
        ([], {}, None),
        (["--api-key", "k1"], {}, "k1"),
        (["--api-key=k2"], {}, "k2"),
        ([], {"VLLM_API_KEY": "k3"}, "k3"),
    ],
)
def test_a_managed_engine_is_reached_with_the_key_it_was_given(
    tmp_path: Path, extra: list[str], env: dict[str, str], key: str | None
) -> None:
    spec = parse_spec(_base(tmp_path) | {"extra_args": extra, "env": env})
    assert spec.api_key == key
    assert spec.target.headers == ({"Authorization": f"Bearer {key}"} if key else {})
