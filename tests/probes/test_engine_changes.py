"""Engine configuration, start, stop and restart as guarded actions: a browser stays inside
the allowlists and leaves the owner's settings alone, the owner steps outside them only with
allow_unsafe (audited), and a saved change waits for someone to start or restart the engine:
a crash restart runs the spec as last started."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from sqlalchemy import Engine

from planner.errors import Forbidden, InvalidInput
from probes.engine import changes
from probes.engine.manager import EngineManager
from probes.worker import work
from probes.worker.engines import EngineRegistry
from storage import dashboards
from storage import queries as q
from storage.access import Actor, Origin, Role, entries
from storage.settings import Settings
from tests.support.waiting import free_port, wait_until

FAKE = Path(__file__).resolve().parents[1] / "support" / "fake_engine.py"
OWNER = Actor("olivia", Role.ADMIN, Origin.CLI)
ADMIN = Actor("ada", Role.ADMIN, Origin.CONSOLE)
OPERATOR = Actor("omar", Role.OPERATOR, Origin.CONSOLE)
VIEWER = Actor("vera", Role.VIEWER, Origin.CONSOLE)


def _fake(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return {
        "name": "fake",
        "model": str(model),
        "vllm": str(FAKE),
        "port": free_port(),
        "kv_cache_memory_bytes": 16 << 20,
        "env": {"OMP_NUM_THREADS": "1"},
    } | extra


@pytest.fixture
def saved(store: Engine, settings: Settings, tmp_path: Path) -> dict[str, Any]:
    """A spec the owner configured from the CLI: what a browser then edits."""
    return changes.configure_engine(store, OWNER, _fake(tmp_path), settings.data_dir).model_dump()


@pytest.mark.parametrize(
    ("change", "named", "why"),
    [
        ({"env": {"LD_PRELOAD": "./evil.so"}}, "LD_PRELOAD", "the dynamic linker loads code"),
        (
            {"env": {"PYTHONWARNINGS": "ignore::x.y", "BROWSER": "sh"}},
            "PYTHONWARNINGS",
            "changes what the engine's Python imports",
        ),
        ({"env": {"BROWSER": "sh"}}, "BROWSER", "webbrowser module runs it as a command"),
        ({"env": {"HF_HUB_OFFLINE": "0"}}, "HF_HUB_OFFLINE", "kvscope sets it"),
        ({"extra_args": ["--trust-remote-code"]}, "--trust-remote-code", "runs Python code"),
        ({"extra_args": ["--middleware", "evil.M"]}, "--middleware", "imports and runs"),
        ({"model": "/elsewhere/model"}, "model", "the model's source"),
        ({"python": "/tmp/python", "vllm": None}, "python", "the executable the worker runs"),
        ({"host": "0.0.0.0"}, "host", "the network the engine listens on"),
        ({"api_key_env": "KVSCOPE_TOKEN_OTHER"}, "api_key_env", "which secret the engine gets"),
    ],
)
def test_a_browser_cannot_set_what_becomes_code_or_belongs_to_the_owner(
    store: Engine,
    settings: Settings,
    saved: dict[str, Any],
    change: dict[str, Any],
    named: str,
    why: str,
) -> None:
    data = saved | change
    with pytest.raises(Forbidden, match=f"{named}.*{why}.*never from a browser"):
        changes.configure_engine(store, ADMIN, data, settings.data_dir)
    assert q.get_engine_spec(store, "fake")[0] == saved  # nothing stored changed
    last = entries(store)[0]
    assert (last.actor, last.action, last.outcome) == ("ada", "engine.configure", "refused")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra_args": ["--host", "0.0.0.0"]}, "--host: has a field of its own"),
        ({"extra_args": ["--api-key", "k"]}, "--api-key: a secret on the command line"),
        ({"env": {"HF_TOKEN": "hf_secret"}}, "HF_TOKEN: looks like a secret"),
        ({"env": {"OMP_NUM_THREADS": "many"}}, "OMP_NUM_THREADS: wants a whole number"),
        ({"env": {"HF_HOME": "/tmp/hf"}}, "HF_HOME: /tmp/hf is not under the data directory"),
    ],
)
def test_bad_values_are_refused_with_the_item_named_for_everyone(
    store: Engine, settings: Settings, saved: dict[str, Any], change: dict[str, Any], message: str
) -> None:
    for who in (ADMIN, OWNER):
        with pytest.raises(InvalidInput, match=message):
            changes.configure_engine(store, who, saved | change, settings.data_dir, who is OWNER)
    assert q.get_engine_spec(store, "fake")[0] == saved


def test_a_browser_edits_within_the_allowlists_and_roles_are_checked(
    store: Engine, settings: Settings, saved: dict[str, Any]
) -> None:
    edit = saved | {
        "max_num_seqs": 4,
        "extra_args": ["--seed", "7", "--async-scheduling"],
        "env": {"OMP_NUM_THREADS": "2", "HF_HOME": str(settings.data_dir / "hf")},
    }
    with pytest.raises(Forbidden, match=r"engine\.configure needs the admin role"):
        changes.configure_engine(store, OPERATOR, edit, settings.data_dir)
    spec = changes.configure_engine(store, ADMIN, edit, settings.data_dir)
    assert spec.max_num_seqs == 4 and spec.argv()[-3:] == ["--seed", "7", "--async-scheduling"]
    with pytest.raises(Forbidden, match="allow_unsafe: stepping outside the allowlists is for"):
        changes.configure_engine(store, ADMIN, edit, settings.data_dir, allow_unsafe=True)
    with pytest.raises(Forbidden, match="a new engine names its model and executable"):
        changes.configure_engine(store, ADMIN, edit | {"name": "new"}, settings.data_dir)


def test_the_owner_steps_outside_with_allow_unsafe_audited_and_a_browser_keeps_it(
    store: Engine, settings: Settings, saved: dict[str, Any]
) -> None:
    unsafe = saved | {"env": {"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4", "OMP_NUM_THREADS": "1"}}
    with pytest.raises(InvalidInput, match=r"LD_PRELOAD.*only the machine's owner, with --allow"):
        changes.configure_engine(store, OWNER, unsafe, settings.data_dir)
    spec = changes.configure_engine(store, OWNER, unsafe, settings.data_dir, allow_unsafe=True)
    assert spec.allow_unsafe
    assert spec.unsafe_items == [
        "LD_PRELOAD=/usr/lib/libtcmalloc.so.4 "
        "(the dynamic linker loads code from it into every engine process)"
    ]
    ok = entries(store)[0]
    assert (ok.actor, ok.origin, ok.outcome) == ("olivia", "cli", "ok")
    assert ok.params["allow_unsafe"] is True and "LD_PRELOAD" in ok.params["env"]
    # A browser may still edit what anyone may; the owner's unsafe setting rides along...
    kept = changes.configure_engine(
        store, ADMIN, spec.model_dump() | {"max_num_seqs": 3}, settings.data_dir
    )
    assert kept.allow_unsafe and kept.env["LD_PRELOAD"] == "/usr/lib/libtcmalloc.so.4"
    # ... but cannot change, add to or drop it.
    for env in (
        {"LD_PRELOAD": "./evil.so", "OMP_NUM_THREADS": "1"},
        {"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4", "BROWSER": "sh"},
        {"OMP_NUM_THREADS": "1"},
    ):
        with pytest.raises(Forbidden, match=r"(LD_PRELOAD|BROWSER).*never from a browser"):
            changes.configure_engine(
                store, ADMIN, kept.model_dump() | {"env": env}, settings.data_dir
            )
    # The owner keeps it only by saying --allow-unsafe again.
    with pytest.raises(InvalidInput, match="LD_PRELOAD"):
        changes.configure_engine(store, OWNER, kept.model_dump(), settings.data_dir)


def test_start_stop_restart_need_an_operator_and_a_typed_name_from_a_browser(
    store: Engine, saved: dict[str, Any]
) -> None:
    with pytest.raises(Forbidden, match=r"engine\.start needs the operator role"):
        changes.start_engine(store, VIEWER, "fake")
    run = changes.start_engine(store, OPERATOR, "fake")
    assert run.kind == "engine_start" and run.requested_by == "omar (operator, console)"
    assert run.params == {"name": "fake", "spec": saved}  # what was saved when asked
    for typed in (None, "", "fak", "FAKE"):
        with pytest.raises(InvalidInput, match=r"type the engine's name \(fake\) to confirm"):
            changes.stop_engine(store, OPERATOR, "fake", typed)
    assert changes.restart_engine(store, OPERATOR, "fake", " fake ").kind == "engine_restart"
    assert changes.stop_engine(store, OWNER, "fake").params == {"name": "fake"}  # the CLI
    outcomes = [(e.action, e.outcome) for e in reversed(entries(store))][1:]
    assert outcomes == [
        ("engine.start", "refused"),
        ("engine.start", "ok"),
        *[("engine.stop", "failed")] * 4,
        ("engine.restart", "ok"),
        ("engine.stop", "ok"),
    ]


@pytest.fixture
def registry(store: Engine, settings: Settings) -> Iterator[EngineRegistry]:
    engines = EngineRegistry(store, settings.data_dir)
    yield engines
    engines.stop_all()


def _handle(store: Engine, engines: EngineRegistry, run_id: int) -> dict[str, Any]:
    """What the worker's control lane does with an engine request."""
    run = q.get_run(store, run_id)
    queue = cast(work.WorkQueue, SimpleNamespace(store=store, engines=engines))
    return work.BUILTIN_HANDLERS[run.kind](queue, run)


def _argv(settings: Settings) -> list[str]:
    pid_file = settings.data_dir / "engines" / "fake" / "engine.pid"
    return [str(a) for a in json.loads(pid_file.read_text())["argv"]]


def test_a_saved_change_waits_for_a_start_crash_restarts_run_the_spec_as_started(
    store: Engine, settings: Settings, tmp_path: Path, registry: EngineRegistry
) -> None:
    # The stand-in crashes 2 s after each start (its variable is the owner's, unsafe).
    crashing = _fake(tmp_path, env={"FAKE_ENGINE_CRASH_AFTER_S": "2"})
    changes.configure_engine(store, OWNER, crashing, settings.data_dir, allow_unsafe=True)
    # Saved and wanted, but never started on request: supervision starts nothing.
    q.set_desired_state(store, "fake", "running")
    registry.supervise()
    assert not registry["fake"].alive()
    _handle(store, registry, changes.start_engine(store, OPERATOR, "fake").id)
    first = q.get_started_spec(store, "fake")
    assert first is not None and "--max-num-seqs" not in _argv(settings)
    # An admin saves a change in the browser; the engine keeps running what was started.
    edit = first | {"max_num_seqs": 7}
    changes.configure_engine(store, ADMIN, edit, settings.data_dir)
    view = dashboards.engine_view(store, "fake")
    assert view.started_spec == first and view.spec["max_num_seqs"] == 7
    manager = registry["fake"]

    def crashed() -> bool:
        registry.supervise()
        return manager.state.status == "crashed"

    wait_until(crashed)
    manager.policy.next_restart = 0.0  # skip the backoff
    registry.supervise()
    assert manager.state.status == "starting"
    assert "--max-num-seqs" not in _argv(settings)  # the crash restart ran the started spec
    assert q.get_started_spec(store, "fake") == first
    # Someone allowed restarts it: now the saved change runs, and is what a crash restarts.
    _handle(store, registry, changes.restart_engine(store, OPERATOR, "fake", "fake").id)
    argv = _argv(settings)
    assert argv[argv.index("--max-num-seqs") + 1] == "7"
    assert q.get_started_spec(store, "fake") == q.get_engine_spec(store, "fake")[0]
    # The engine's events name who asked; the crash restart was the worker's own.
    by = {(e.kind, e.actor) for e in q.events(store, 0, time.time() + 1)}
    assert ("engine_starting", str(OPERATOR)) in by and ("engine_stopped", str(OPERATOR)) in by
    assert ("engine_starting", None) in by  # the crash restart


def test_a_restart_runs_the_saved_spec_though_supervision_passes_while_it_is_down(
    store: Engine,
    settings: Settings,
    saved: dict[str, Any],
    registry: EngineRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Supervision sets a stopped engine's manager to the spec last started. A pass that
    fell between a restart's stop and its start (once in CI, beside the CPU hog) launched
    the engine, or recorded it, with the old spec; the restart must run the saved one."""
    _handle(store, registry, changes.start_engine(store, OPERATOR, "fake").id)
    changes.configure_engine(store, ADMIN, saved | {"max_num_seqs": 7}, settings.data_dir)
    start = EngineManager.start

    def start_after_a_supervision_pass(manager: EngineManager, *args: Any, **kw: Any) -> Any:
        registry.manager("fake")  # what supervise() does first: reads the spec last started
        return start(manager, *args, **kw)

    monkeypatch.setattr(EngineManager, "start", start_after_a_supervision_pass)
    _handle(store, registry, changes.restart_engine(store, OPERATOR, "fake", "fake").id)
    argv = _argv(settings)
    assert argv[argv.index("--max-num-seqs") + 1] == "7"
    assert registry["fake"].spec.max_num_seqs == 7
    assert q.get_started_spec(store, "fake") == q.get_engine_spec(store, "fake")[0]
    registry.supervise()  # and a pass once it runs leaves it so
    assert registry["fake"].spec.max_num_seqs == 7


def test_keep_running_is_the_owners_start_for_the_next_worker(
    store: Engine, saved: dict[str, Any]
) -> None:
    with pytest.raises(Forbidden):
        changes.keep_running(store, VIEWER, "fake")
    changes.keep_running(store, OWNER, "fake")
    assert q.get_started_spec(store, "fake") == saved
    assert q.get_engine_spec(store, "fake")[1] == "running"


def test_a_spec_an_earlier_kvscope_stored_can_be_stopped_not_started(
    store: Engine, saved: dict[str, Any], registry: EngineRegistry
) -> None:
    legacy = saved | {"env": {"VLLM_API_KEY": "k-from-before"}}
    q.save_engine_spec(store, "old", legacy | {"name": "old"})
    q.mark_started(store, "old", legacy | {"name": "old"})
    with pytest.raises(InvalidInput, match="VLLM_API_KEY: looks like a secret"):
        changes.start_engine(store, OWNER, "old")
    assert changes.stop_engine(store, OWNER, "old").params == {"name": "old"}
    # Supervision says so once, and goes on with the other engines.
    changes.keep_running(store, OWNER, "fake")
    for _ in range(3):
        registry.supervise()
    refused = q.events(store, 0, time.time() + 1, kinds=["engine_spec_refused"])
    assert len(refused) == 1 and "engine old is not supervised" in refused[0].message
    assert "k-from-before" not in refused[0].message
    assert "fake" in registry and "old" not in registry


def test_docs_name_every_variable_and_flag_the_allowlists_hold() -> None:
    from probes.engine.allowlists import ENV, FIELD_FLAGS, FLAGS, KVSCOPE_SETS

    docs = (Path(__file__).resolve().parents[2] / "docs" / "engine.md").read_text()
    names = [*ENV, *FLAGS, *KVSCOPE_SETS, *(f for f in FIELD_FLAGS if not f.startswith("--no-"))]
    missing = [n for n in names if f"`{n}`" not in docs and f"`{n}=" not in docs]
    assert missing == [], missing
