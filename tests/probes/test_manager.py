"""The engine manager's process handling, on a stand-in engine (fast; the real one: e2e)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from planner.errors import EngineError
from probes.engine import EngineManager, EngineSpec, group_pids, parse_spec
from probes.engine.logs import LOG_BACKUPS, rotate
from probes.engine.process import CPU_ENGINE_NICE
from probes.engine.spec import cpu_threads
from storage import queries as q
from storage.settings import Settings
from tests.support.waiting import free_port, wait_until

FAKE = Path(__file__).resolve().parents[1] / "support" / "fake_engine.py"


def _polled(m: EngineManager, desired: str) -> str:
    """One supervision step, then the status it left."""
    m.poll(desired)
    return m.state.status


def _spec(tmp_path: Path, **env: str) -> EngineSpec:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return parse_spec(
        {
            "name": "fake",
            "model": str(model),
            "vllm": str(FAKE),
            "port": free_port(),
            "kv_cache_memory_bytes": 16 << 20,
            "env": env,
            # The stand-in's own variables are off the allowlist: the owner's, as in a test.
            "allow_unsafe": bool(env),
        }
    )


@pytest.fixture
def managers() -> Iterator[list[EngineManager]]:
    made: list[EngineManager] = []
    yield made
    for m in made:
        m.stop(timeout=5)


def _manager(
    store: Engine, settings: Settings, spec: EngineSpec, made: list[EngineManager]
) -> EngineManager:
    m = EngineManager(store, settings.data_dir, spec)
    made.append(m)
    return m


def test_start_parses_the_log_and_stop_takes_the_whole_group(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    m = _manager(store, settings, _spec(tmp_path), managers)
    state = m.start(timeout=30)
    assert state.status == "running" and state.message == "serving model"
    pgid = state.pid
    assert pgid is not None and len(group_pids(pgid)) == 2  # server + its child
    wait_until(lambda: "kv_capacity" in m.state.facts)
    assert m.state.facts["kv_capacity"] == {"device": "CPU", "tokens": 16384.0}
    target = q.get_target(store, "fake")
    assert target.managed and target.enabled and target.base_url == m.spec.base_url
    with pytest.raises(EngineError, match="already running"):
        m.start()
    m.stop()
    assert group_pids(pgid) == [] and m.state.status == "stopped"
    assert not q.get_target(store, "fake").enabled
    kinds = [e.kind for e in q.events(store, 0, time.time() + 1)]
    assert {"engine_starting", "engine_healthy", "engine_kv_capacity", "engine_stopped"} <= set(
        kinds
    )


def test_a_cpu_engine_yields_the_cores_to_the_worker_and_leaves_one(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    """Every thread of a CPU engine's group, its child too, runs CPU_ENGINE_NICE levels below
    the worker, in the worker's session (its autogroup, where the kernel has them: nice
    weighs only within one): the load generator preempts it on waking."""
    m = _manager(store, settings, _spec(tmp_path), managers)
    pgid = m.start(timeout=30).pid
    assert pgid is not None
    want = min(os.getpriority(os.PRIO_PROCESS, 0) + CPU_ENGINE_NICE, 19)
    pids = group_pids(pgid)
    assert len(pids) == 2  # server + its child
    for pid in pids:
        assert os.getsid(pid) == os.getsid(0) and os.getpgid(pid) == pgid != os.getpgid(0)
        for task in Path(f"/proc/{pid}/task").iterdir():
            assert os.getpriority(os.PRIO_PROCESS, int(task.name)) == want, (pid, task.name)
        # Its forward pass in one unpinned thread per core but one.
        environ = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        assert {f"{k}={v}".encode() for k, v in cpu_threads().items()} <= environ
    own, theirs = Path("/proc/self/autogroup"), Path(f"/proc/{pgid}/autogroup")
    if own.exists():
        assert theirs.read_text() == own.read_text()  # one autogroup, its nice untouched


def test_a_crash_is_an_event_with_the_last_lines_and_it_restarts(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    m = _manager(store, settings, _spec(tmp_path, FAKE_ENGINE_CRASH_AFTER_S="1.5"), managers)
    m.start(timeout=30)
    first = m.state.pid
    wait_until(lambda: _polled(m, "running") == "crashed")
    crash = q.events(store, 0, time.time() + 1, kinds=["engine_crashed"])[0]
    assert crash.data["exit_code"] == 3
    assert "RuntimeError: fake engine died" in "\n".join(crash.data["last_lines"])
    assert any(e.kind == "engine_traceback" for e in q.events(store, 0, time.time() + 1))
    assert first is not None and group_pids(first) == []  # the orphaned child was killed too
    assert "restarting in 5 s" in m.state.message
    m.policy.next_restart = 0.0  # skip the backoff wait
    m.poll("running")
    assert m.state.status == "starting" and m.state.pid != first
    m.spec = m.spec.model_copy(update={"env": {}})  # the next one stays up


def test_a_crash_while_not_wanted_is_not_restarted(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    m = _manager(store, settings, _spec(tmp_path, FAKE_ENGINE_CRASH_AFTER_S="1"), managers)
    m.start(timeout=30)
    wait_until(lambda: _polled(m, "stopped") == "crashed")
    m.policy.next_restart = 0.0
    m.poll("stopped")
    assert m.state.status == "crashed" and not m.alive()


def test_refused_before_anything_starts(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    spec = _spec(tmp_path)
    (Path(spec.model) / "config.json").unlink()
    m = _manager(store, settings, spec, managers)
    with pytest.raises(EngineError, match=r"has no config\.json"):
        m.start()
    assert not m.process.pid_path.exists() and m.state.status == "stopped"


def test_adoption_and_cleanup_after_a_worker_dies(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    spec = _spec(tmp_path)
    first = _manager(store, settings, spec, managers)
    first.start(timeout=30)
    pids = sorted(group_pids(first.state.pid or 0))
    first.abandon()  # the worker process is gone; the engine is not
    again = _manager(store, settings, spec, managers)
    assert again.adopt_or_clean("running") is True
    wait_until(lambda: again.check_health() and again.state.status == "running")
    assert sorted(group_pids(again.state.pid or 0)) == pids  # the same processes, no second
    # A worker that no longer wants it (or has another spec) stops it instead.
    third = _manager(store, settings, spec.model_copy(update={"max_model_len": 2048}), managers)
    assert third.adopt_or_clean("running") is False
    assert group_pids(pids[0]) == [] and not third.process.pid_path.exists()


def test_log_rotation_keeps_backups(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    m = _manager(store, settings, _spec(tmp_path), managers)
    log = m.process.log_path
    log.parent.mkdir(parents=True)
    for i in range(LOG_BACKUPS + 2):
        log.write_text(f"generation {i}\n")
        rotate(log)
    assert log.read_text() == ""
    assert log.with_suffix(".log.1").read_text() == f"generation {LOG_BACKUPS + 1}\n"
    assert not log.with_suffix(f".log.{LOG_BACKUPS + 1}").exists()


def test_kill_9_of_the_main_process(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    m = _manager(store, settings, _spec(tmp_path), managers)
    m.start(timeout=30)
    pid = m.state.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _polled(m, "running") == "crashed")
    crash = q.events(store, 0, time.time() + 1, kinds=["engine_crashed"])[0]
    assert crash.data["exit_code"] == -signal.SIGKILL and group_pids(pid) == []


def test_a_pid_file_naming_another_process_is_never_signalled(
    store: Engine, settings: Settings, tmp_path: Path, managers: list[EngineManager]
) -> None:
    import json
    import subprocess

    # A stranger that got the pid number (here: any other process in its own group).
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        m = _manager(store, settings, _spec(tmp_path), managers)
        m.process.run_dir.mkdir(parents=True, exist_ok=True)
        m.process.pid_path.write_text(
            json.dumps(
                {
                    "pid": stranger.pid,
                    "pgid": stranger.pid,
                    "started_at": time.time(),
                    "spec_hash": "x",
                    "argv": ["python", "entry.py", "serve", "model"],
                    "identity": ["another-boot", 1, "python entry.py serve model"],
                }
            )
        )
        assert m.adopt_or_clean("stopped") is False  # "stopped" would stop an adopted one
        assert stranger.poll() is None  # alive: no signal reached it
        assert not m.process.pid_path.exists()
        kinds = [e.kind for e in q.events(store, 0, time.time() + 1)]
        assert "engine_not_adopted" in kinds
    finally:
        stranger.kill()
        stranger.wait()


def test_secrets_reach_the_engine_and_nothing_else(
    store: Engine,
    settings: Settings,
    tmp_path: Path,
    managers: list[EngineManager],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret, other = "k3y-of-the-engine-1", "token-of-another-target"
    monkeypatch.setenv("KVSCOPE_TOKEN_FAKE", secret)
    monkeypatch.setenv("KVSCOPE_TOKEN_PROD", other)
    spec = _spec(tmp_path).model_copy(update={"api_key_env": "KVSCOPE_TOKEN_FAKE"})
    m = _manager(store, settings, spec, managers)
    m.start(timeout=30)
    pid = m.state.pid
    assert pid is not None
    environ = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
        if "=" in item
    )
    # The engine gets its key as VLLM_API_KEY, and not the worker's other tokens.
    assert environ["VLLM_API_KEY"] == secret and "KVSCOPE_TOKEN_PROD" not in environ
    assert m.vllm.target.headers == {"Authorization": f"Bearer {secret}"}
    m.publish()
    # Not on the command line, in the log's echo of it, the pid file, events or state.
    written = [
        Path(f"/proc/{pid}/cmdline").read_text(),
        m.process.log_path.read_text(),
        m.process.pid_path.read_text(),
        str(q.events(store, 0, time.time() + 1)),
        str(q.get_state(store, "engine:fake")),
        str(q.get_state(store, "engine_log:fake")),
    ]
    for text in written:
        assert secret not in text and other not in text
    assert 'VLLM_API_KEY="$KVSCOPE_TOKEN_FAKE"' in m.state.command
    # Without its variable the engine does not start, and says which variable is missing.
    m.stop()
    monkeypatch.delenv("KVSCOPE_TOKEN_FAKE")
    with pytest.raises(EngineError, match=r"\$KVSCOPE_TOKEN_FAKE, which is not set"):
        m.start()
