"""The CLI's one error boundary, `app.cli.main()`: what a user sees, and the exit code.

Through the installed console script (`kvscope`, as a user runs it) and in-process with a
stand-in Typer app for failures no real command can be made to raise on purpose.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer

import app.cli
from planner.errors import DatabaseLocked, StorageError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "kvscope"


def run(*args: str, data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed `kvscope ARGS` on a data directory of its own (`make install` puts the
    script beside this interpreter: without it the install is broken, and the test fails)."""
    assert SCRIPT.exists(), f"no kvscope console script at {SCRIPT}: run make install"
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "KVSCOPE_DATA_DIR": str(data_dir), **env},
        timeout=60,
    )


def test_unknown_command_prints_usage_and_exits_2(tmp_path: Path) -> None:
    res = run("nosuch", data_dir=tmp_path)
    assert res.returncode == 2
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0] == "Usage: kvscope [OPTIONS] COMMAND [ARGS]..."
    assert lines[-1] == "Error: No such command 'nosuch'."


def test_unknown_option_prints_usage_and_exits_2(tmp_path: Path) -> None:
    res = run("target", "list", "--bogus", data_dir=tmp_path)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0] == "Usage: kvscope target list [OPTIONS]"
    assert lines[-1] == "Error: No such option: --bogus"


def test_kvscope_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = run("target", "remove", "nope", data_dir=tmp_path)
    assert res.returncode == 2
    assert res.stderr.splitlines() == ["error: no target named 'nope'; known targets: none"]


def test_storage_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"this is no SQLite database, but long enough to be read as one" * 20)
    res = run("target", "list", data_dir=tmp_path, KVSCOPE_DATABASE_URL=f"sqlite:///{damaged}")
    assert res.returncode == 2
    [line] = res.stderr.splitlines()
    assert line.startswith("error: ") and str(damaged) in line


def test_python_m_app_cli_runs_the_same_cli(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "app.cli", "export", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "prometheus-rules" in res.stdout


def test_a_bug_is_one_line_exit_1_and_a_logged_traceback(tmp_path: Path) -> None:
    # No real command fails on purpose: run main() with a stand-in app that raises.
    code = textwrap.dedent(
        """
        import typer
        import app.cli

        broken = typer.Typer()

        @broken.command()
        def crash() -> None:
            raise RuntimeError("boom\\nsecond line")

        app.cli.app = broken
        app.cli.main()
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "KVSCOPE_DATA_DIR": str(tmp_path)},
        timeout=60,
    )
    log_file = tmp_path / "logs" / "cli.log"
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"error: internal error: RuntimeError: boom second line (details in {log_file})"
    ]
    logged = log_file.read_text()
    assert "Traceback" in logged and "RuntimeError: boom" in logged


def _app_raising(err: Exception) -> typer.Typer:
    stand_in = typer.Typer()

    @stand_in.command()
    def fail() -> None:
        raise err

    return stand_in


@pytest.mark.parametrize(
    "err",
    [
        DatabaseLocked("the database is locked by another process; try again"),
        StorageError("cannot write /data/kvscope.db: read-only file system"),
    ],
)
def test_main_turns_storage_errors_into_one_line(
    err: StorageError,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(app.cli, "app", _app_raising(err))
    monkeypatch.setattr(sys, "argv", ["kvscope"])
    with pytest.raises(SystemExit) as info:
        app.cli.main()
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {err}"]


def test_main_logs_a_bug_where_logging_goes(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(app.cli, "app", _app_raising(KeyError("missing")))
    monkeypatch.setattr(sys, "argv", ["kvscope"])
    with caplog.at_level(logging.ERROR, logger="app.cli"), pytest.raises(SystemExit) as info:
        app.cli.main()
    assert info.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: internal error: KeyError: 'missing' (details in the log)"
    ]
    [record] = [r for r in caplog.records if r.name == "app.cli"]
    assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)
