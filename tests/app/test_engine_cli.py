"""`kvscope engine configure` as the machine's owner: the same allowlists hold, each refusal
names the variable or flag and why, `--allow-unsafe` steps outside them (audited, shown),
and secrets are given by reference, never stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from app.cli import app
from planner.errors import InvalidInput, NotFound
from storage import queries as q
from storage.access import Actor, entries
from storage.db import open_store

runner = CliRunner()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory of its own, with a model folder and an executable to name."""
    monkeypatch.delenv("KVSCOPE_DATABASE_URL", raising=False)
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "python").write_text("#!/bin/sh\n")
    (tmp_path / "python").chmod(0o755)
    return tmp_path


def kvscope(*args: str, env: dict[str, str] | None = None) -> Result:
    """`kvscope ARGS` in this process (the store is the data directory's)."""
    return runner.invoke(app, list(args), env=env)


def configure(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """The measured command's shape: a new engine `evil` with a model, a python and KV bytes."""
    return kvscope(
        "engine", "configure", "evil",
        "--model", str(data_dir / "model"),
        "--python", str(data_dir / "python"),
        "--set", "kv_cache_memory_bytes=16777216",
        *args,
        env=env,
    )  # fmt: skip


def refused(result: Result) -> str:
    """The one-line error a refused command ends with (main() prints it, exit 2)."""
    assert isinstance(result.exception, InvalidInput), (result.exception, result.output)
    return str(result.exception)


def test_the_measured_injection_is_refused_naming_each_variable(data_dir: Path) -> None:
    result = configure(data_dir, "--env", "LD_PRELOAD=./evil.so", "--env", "BROWSER=sh")
    message = refused(result)
    assert "LD_PRELOAD: the dynamic linker loads code from it" in message
    assert "BROWSER: Python's webbrowser module runs it as a command" in message
    assert message.count("only the machine's owner, with --allow-unsafe") == 2
    missing = kvscope("engine", "show", "evil")
    assert isinstance(missing.exception, NotFound)  # nothing was stored
    (entry,) = entries(open_store(f"sqlite:///{data_dir / 'kvscope.db'}"))
    assert (entry.action, entry.subject, entry.outcome) == ("engine.configure", "evil", "failed")


@pytest.mark.parametrize(
    ("args", "named", "why"),
    [
        (["--env", "PYTHONWARNINGS=ignore::x.y"], "PYTHONWARNINGS", "the engine's Python imports"),
        (["--env", "HF_HUB_OFFLINE=0"], "HF_HUB_OFFLINE", "kvscope sets it"),
        (["--env", "OMP_TOOL_LIBRARIES=x.so"], "OMP_TOOL_LIBRARIES", "OpenMP loads the libraries"),
        (["--args=--middleware evil.M"], "--middleware", "imports and runs the Python code"),
        (["--args=--log-config-file /x.json"], "--log-config-file", "any Python object"),
        (["--args=--host 0.0.0.0"], "--host", "has a field of its own: set host"),
        (["--args=--api-key k"], "--api-key", "a secret on the command line"),
        (["--env", "HF_TOKEN=hf_abc"], "HF_TOKEN", "looks like a secret"),
        (["--env", "VLLM_API_KEY=abc"], "VLLM_API_KEY", "looks like a secret"),
        (["--api-key-env", "MY_KEY"], "api_key_env", "must name a variable KVSCOPE_TOKEN_"),
        (["--env", "OMP_NUM_THREADS=lots"], "OMP_NUM_THREADS", "wants a whole number"),
        (["--args=--seed one"], "--seed", "wants a whole number"),
    ],
)
def test_each_injection_is_refused_with_its_reason(
    data_dir: Path, args: list[str], named: str, why: str
) -> None:
    message = refused(configure(data_dir, *args))
    assert f"{named}: " in message and why in message, message


def test_what_only_the_owner_may_set_is_set_from_the_cli(data_dir: Path) -> None:
    made = configure(
        data_dir, "--host", "0.0.0.0", "--args", "--trust-remote-code --seed 1",
        "--env", "OMP_NUM_THREADS=2",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "--host 0.0.0.0" in made.stdout and "--trust-remote-code --seed 1" in made.stdout
    cleared = kvscope("engine", "configure", "evil", "--args=")
    assert cleared.exit_code == 0 and "--trust-remote-code" not in cleared.stdout


def test_allow_unsafe_is_the_owners_audited_and_shown(data_dir: Path) -> None:
    tcmalloc = "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    made = configure(data_dir, "--env", tcmalloc, "--allow-unsafe")
    assert made.exit_code == 0, made.output
    assert tcmalloc in made.stdout
    assert "warning: outside the allowlists (--allow-unsafe): LD_PRELOAD=" in made.output
    shown = json.loads(kvscope("engine", "show", "evil", "--json").stdout)
    assert shown["spec"]["allow_unsafe"] is True
    assert shown["unsafe"] == [
        f"{tcmalloc} (the dynamic linker loads code from it into every engine process)"
    ]
    entry = entries(open_store(f"sqlite:///{data_dir / 'kvscope.db'}"))[0]
    assert (entry.actor, entry.origin, entry.outcome) == (Actor.machine_owner().name, "cli", "ok")
    assert entry.params["allow_unsafe"] is True and "LD_PRELOAD" in entry.params["env"]
    # A later change without the flag does not quietly keep what is outside the allowlists.
    again = kvscope("engine", "configure", "evil", "--set", "max_num_seqs=4")
    assert "LD_PRELOAD: " in refused(again) and "--allow-unsafe" in refused(again)
    # The Engine page shows it to everyone who reads the spec.
    from tests.support.pages import run_page

    at = run_page("engine")
    assert any("--allow-unsafe" in w.value and tcmalloc in w.value for w in at.warning)


def test_secrets_are_given_by_reference_and_never_stored(data_dir: Path) -> None:
    secret = "hunter2-engine-key"
    made = configure(
        data_dir, "--api-key-env", "KVSCOPE_TOKEN_ENGINE", "--hf-token-env", "KVSCOPE_TOKEN_HF",
        env={"KVSCOPE_TOKEN_ENGINE": secret},
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert 'VLLM_API_KEY="$KVSCOPE_TOKEN_ENGINE"' in made.stdout
    assert 'HF_TOKEN="$KVSCOPE_TOKEN_HF"' in made.stdout
    store = open_store(f"sqlite:///{data_dir / 'kvscope.db'}")
    spec, _ = q.get_engine_spec(store, "evil")
    assert spec["api_key_env"] == "KVSCOPE_TOKEN_ENGINE"
    assert secret not in json.dumps(spec) + made.output + str(entries(store))
    cleared = kvscope("engine", "configure", "evil", "--api-key-env", "")
    assert cleared.exit_code == 0 and "VLLM_API_KEY" not in cleared.stdout


def test_a_spec_file_of_the_owners_is_read_first(data_dir: Path) -> None:
    spec_file = data_dir / "evil.json"
    spec_file.write_text(json.dumps({"max_model_len": 2048, "env": {"BROWSER": "sh"}}))
    assert "BROWSER: " in refused(configure(data_dir, "--from-file", str(spec_file)))
    spec_file.write_text(json.dumps({"max_model_len": 2048}))
    made = configure(data_dir, "--from-file", str(spec_file), "--set", "max_num_seqs=2")
    assert made.exit_code == 0 and "--max-model-len 2048 --max-num-seqs 2" in made.stdout
    spec_file.write_text("[1]")
    assert "must hold a JSON object" in refused(configure(data_dir, "--from-file", str(spec_file)))
