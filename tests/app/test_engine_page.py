"""The Engine page from a stored spec and published state (no engine needed)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

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
    # Stop and restart need the confirmation first.
    stop = next(b for b in at.button if b.label == "Stop")
    assert stop.disabled
    next(b for b in at.button if b.label == "Start").click().run()
    assert [(r.kind, r.params) for r in q.list_runs(store)] == [
        ("engine_start", {"name": "embedded"})
    ]


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
    env.set_value("VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1 OMP_PLACES='{0,1}'")
    next(b for b in at.button if b.label == "Save spec").click().run()
    assert not at.error and at.success[0].value.startswith("Saved.")
    saved, _ = q.get_engine_spec(store, "embedded")
    assert saved["env"] == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "1",
        "OMP_PLACES": "{0,1}",
    }
    # A malformed item is refused by name and the stored environment is kept.
    env = next(t for t in at.text_input if t.label == "Environment")
    env.set_value("OMP_NUM_THREADS=2 1BAD=x")
    next(b for b in at.button if b.label == "Save spec").click().run()
    assert any("'1BAD=x' is not KEY=VALUE" in e.value for e in at.error)
    assert q.get_engine_spec(store, "embedded")[0]["env"] == saved["env"]
