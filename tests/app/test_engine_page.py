"""The Engine page from a stored spec and published state (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy import text as text_
from streamlit.testing.v1 import AppTest

from probes.engine.spec import embedded_spec
from storage import queries as q
from storage.settings import Settings
from tests.support.pages import run_page


def _tiny_model(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, '
        '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, '
        '"head_dim": 32, "intermediate_size": 256, "vocab_size": 4096, '
        '"max_position_embeddings": 8192, "torch_dtype": "float32"}'
    )


def test_without_an_engine_the_page_says_how_to_get_one(store: Engine) -> None:
    at = run_page("engine")
    assert any("kvscope up" in i.value for i in at.info)


def test_status_command_facts_and_prediction(store: Engine, settings: Settings) -> None:
    spec = embedded_spec(settings)
    _tiny_model(Path(spec.model))
    q.save_engine_spec(store, spec.name, spec.model_dump())
    q.put_state(
        store,
        "engine:embedded",
        {
            "name": "embedded",
            "status": "running",
            "pid": 4242,
            "restarts": 1,
            "healthy_at": 1.0,
            "message": "serving tiny-llama",
            "facts": {
                "kv_capacity": {"device": "CPU", "tokens": 16384.0},
                "max_concurrency": {"tokens_per_request": 8192.0, "concurrency": 2.0},
            },
        },
    )
    q.put_state(store, "engine_log:embedded", {"lines": ["INFO hello from vllm"]})
    at = run_page("engine")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Status"] == "running" and metrics["Restarts"] == "1"
    assert "--kv-cache-memory-bytes 16777216" in at.code[-1].value
    table = at.dataframe[0].value
    row = table[table[""] == "KV capacity (tokens, as logged)"].iloc[0]
    assert row["vLLM reported"] == 16384 and row["planner"] == 16384
    conc = table[table[""] == "Max concurrency at max length"].iloc[0]
    assert conc["vLLM reported"] == conc["planner"] == 2.0
    # Stop and restart need the engine's name typed first.
    stop = next(b for b in at.button if b.label == "Stop")
    assert stop.disabled
    next(b for b in at.button if b.label == "Start").click().run()
    (run,) = q.list_runs(store)
    assert (run.kind, run.params) == (
        "engine_start",
        {"name": "embedded", "spec": spec.model_dump()},
    )
    assert run.requested_by == "local (admin, console)"
    next(t for t in at.text_input if t.label.startswith("Type the engine's name")).set_value(
        "embedded"
    ).run()
    next(b for b in at.button if b.label == "Stop").click().run()
    assert [r.kind for r in q.list_runs(store)] == ["engine_stop", "engine_start"]


def test_saving_a_bad_spec_shows_why(store: Engine, settings: Settings) -> None:
    spec = embedded_spec(settings)
    q.save_engine_spec(store, spec.name, spec.model_dump())
    at = run_page("engine")
    block = next(n for n in at.number_input if n.label.startswith("Block size"))
    block.set_value(48)
    next(b for b in at.button if b.label == "Save spec").click().run()
    assert any("block_size 48 does not work on CPU" in e.value for e in at.error)
    saved, _ = q.get_engine_spec(store, "embedded")
    assert saved["block_size"] == 32  # nothing stored was lost


def test_the_environment_is_edited_as_key_value_items(store: Engine, settings: Settings) -> None:
    spec = embedded_spec(settings)
    q.save_engine_spec(store, spec.name, spec.model_dump())
    at = run_page("engine")
    env = next(t for t in at.text_input if t.label == "Environment")
    assert env.value == "VLLM_ENABLE_V1_MULTIPROCESSING=0"
    env.set_value(
        f"VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1 HF_HOME='{settings.data_dir}/hf'"
    )
    next(b for b in at.button if b.label == "Save spec").click().run()
    assert not at.error and at.success[0].value.startswith("Saved.")
    saved, _ = q.get_engine_spec(store, "embedded")
    assert saved["env"] == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "1",
        "HF_HOME": f"{settings.data_dir}/hf",
    }
    # A malformed item is refused by name and the stored environment is kept.
    env = next(t for t in at.text_input if t.label == "Environment")
    env.set_value("OMP_NUM_THREADS=2 1BAD=x")
    next(b for b in at.button if b.label == "Save spec").click().run()
    assert any("'1BAD=x' is not KEY=VALUE" in e.value for e in at.error)
    assert q.get_engine_spec(store, "embedded")[0]["env"] == saved["env"]


def _save(at: AppTest, env: str | None = None, extra: str | None = None) -> AppTest:
    """Fill the form's environment and extra arguments, press Save."""
    if env is not None:
        next(t for t in at.text_input if t.label == "Environment").set_value(env)
    if extra is not None:
        next(t for t in at.text_input if t.label == "Extra arguments").set_value(extra)
    next(b for b in at.button if b.label == "Save spec").click().run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _page_text(at: AppTest, inputs: bool = True) -> str:
    """Everything the page shows as text, tables included (and what its text inputs hold)."""
    parts: list[str] = []
    for kind in ("error", "warning", "info", "success", "caption", "code", "markdown"):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [t.value or "" for t in at.text_input] if inputs else []
    parts += [df.value.to_string() for df in at.dataframe]
    return "\n".join(parts)


@pytest.mark.parametrize(
    ("env", "extra", "named", "why"),
    [
        ("LD_PRELOAD=./evil.so", None, "LD_PRELOAD", "the dynamic linker loads code"),
        ("PYTHONWARNINGS=ignore::x BROWSER=sh", None, "PYTHONWARNINGS", "Python imports"),
        ("PYTHONWARNINGS=ignore::x BROWSER=sh", None, "BROWSER", "webbrowser module runs it"),
        ("HF_HUB_OFFLINE=0", "--trust-remote-code", "HF_HUB_OFFLINE", "kvscope sets it"),
        ("HF_HUB_OFFLINE=0", "--trust-remote-code", "--trust-remote-code", "runs Python code"),
        (None, "--middleware evil.Middleware", "--middleware", "imports and runs"),
        (None, "--host 0.0.0.0", "--host", "has a field of its own"),
        (None, "--api-key sk-live-123", "--api-key", "a secret on the command line"),
        ("HF_TOKEN=hf_abc", None, "HF_TOKEN", "looks like a secret"),
    ],
)
def test_each_injection_is_refused_on_the_form_with_its_reason(
    store: Engine, settings: Settings, env: str | None, extra: str | None, named: str, why: str
) -> None:
    spec = embedded_spec(settings)
    q.save_engine_spec(store, spec.name, spec.model_dump())
    at = _save(run_page("engine"), env, extra)
    assert not at.success
    assert any(named in e.value and why in e.value for e in at.error), [e.value for e in at.error]
    assert q.get_engine_spec(store, "embedded")[0] == spec.model_dump()
    assert "sk-live-123" not in _page_text(at, inputs=False)  # typed here, never echoed


def test_the_owners_settings_are_shown_not_edited(store: Engine, settings: Settings) -> None:
    spec = embedded_spec(settings).model_copy(
        update={"extra_args": ["--trust-remote-code", "--seed", "1"]}
    )
    q.save_engine_spec(store, spec.name, spec.model_dump())
    at = run_page("engine")
    labels = [t.label for t in at.text_input]
    assert not any("Model" in label or "python" in label.lower() for label in labels)
    owners = at.dataframe[-1].value.set_index("")["value"]
    assert owners["Model"] == spec.model and owners["Executable"] == spec.python
    assert owners["Owner's flags"] == "--trust-remote-code"
    extra = next(t for t in at.text_input if t.label == "Extra arguments")
    assert extra.value == "--seed 1"
    _save(at, extra="--seed 2")  # the owner's flag is kept as it was
    assert q.get_engine_spec(store, "embedded")[0]["extra_args"] == [
        "--seed",
        "2",
        "--trust-remote-code",
    ]


def test_unsafe_settings_by_the_owner_are_shown_and_kept(store: Engine, settings: Settings) -> None:
    from probes.engine import changes
    from storage.access import Actor

    data = embedded_spec(settings).model_dump()
    data["env"] = data["env"] | {"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}
    changes.configure_engine(
        store, Actor.machine_owner(), data, settings.data_dir, allow_unsafe=True
    )
    at = run_page("engine")
    assert any(
        "--allow-unsafe" in w.value and "LD_PRELOAD=/usr/lib/libtcmalloc.so.4" in w.value
        for w in at.warning
    )
    env = next(t for t in at.text_input if t.label == "Environment").value or ""
    assert "LD_PRELOAD" not in env
    _save(at, env=env + " OMP_NUM_THREADS=1")
    assert not at.error
    saved = q.get_engine_spec(store, "embedded")[0]
    assert saved["allow_unsafe"] and saved["env"]["LD_PRELOAD"] == "/usr/lib/libtcmalloc.so.4"
    _save(at, env="LD_PRELOAD=./evil.so")
    assert any(
        "LD_PRELOAD=./evil.so" in e.value and "never from a browser" in e.value for e in at.error
    )


def test_secrets_are_masked_on_the_page_and_never_stored(
    store: Engine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from probes.engine import changes
    from storage.access import Actor

    secret = "s3cret-engine-key-42"
    monkeypatch.setenv("KVSCOPE_TOKEN_ENGINE", secret)
    data = embedded_spec(settings).model_dump() | {"api_key_env": "KVSCOPE_TOKEN_ENGINE"}
    changes.configure_engine(store, Actor.machine_owner(), data, settings.data_dir)
    # What an older kvscope may have left in the published state and log.
    q.put_state(
        store,
        "engine:embedded",
        {"name": "embedded", "status": "running", "message": "Authorization: Bearer abc.def"},
    )
    q.put_state(store, "engine_log:embedded", {"lines": ["sent Authorization: Bearer abc.def"]})
    at = run_page("engine")
    text = _page_text(at)
    assert secret not in text and "abc.def" not in text
    assert 'VLLM_API_KEY="$KVSCOPE_TOKEN_ENGINE"' in at.code[-1].value
    owners = at.dataframe[-1].value.set_index("")["value"]
    assert owners["API key from"] == "$KVSCOPE_TOKEN_ENGINE"
    with store.connect() as conn:
        stored = json.dumps([list(r) for r in conn.execute(text_("SELECT * FROM engine_specs"))])
    assert secret not in stored and "KVSCOPE_TOKEN_ENGINE" in stored


def test_the_page_says_when_the_saved_spec_is_not_what_runs(
    store: Engine, settings: Settings
) -> None:
    spec = embedded_spec(settings)
    q.save_engine_spec(store, spec.name, spec.model_dump())
    at = run_page("engine")
    assert any("Never started on request" in c.value for c in at.caption)
    q.mark_started(store, "embedded", spec.model_dump())
    q.put_state(store, "engine:embedded", {"name": "embedded", "status": "running"})
    at = run_page("engine")
    assert not any("differs" in w.value for w in at.warning)
    next(n for n in at.number_input if n.label.startswith("Max running")).set_value(6)
    next(b for b in at.button if b.label == "Save spec").click().run()
    warning = next(w.value for w in at.warning if "differs" in w.value)
    assert "the engine runs" in warning and "max_num_seqs: 128 → 6" in warning


def test_a_viewer_sees_the_engine_but_cannot_change_it(
    store: Engine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app import common
    from storage.access import Actor, Origin, Role

    spec = embedded_spec(settings)
    q.save_engine_spec(store, spec.name, spec.model_dump())
    monkeypatch.setattr(common, "actor", lambda: Actor("vera", Role.VIEWER, Origin.CONSOLE))
    at = run_page("engine")
    assert all(b.disabled for b in at.button if b.label in ("Start", "Stop", "Restart"))
    assert next(b for b in at.button if b.label == "Save spec").disabled
