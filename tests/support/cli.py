"""Run `kvscope` as a user does: a real process, from the repository, on a chosen data dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def kvscope(
    *args: str,
    env_dir: Path | None = None,
    timeout: float = 60,
    environ: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`kvscope ARGS` with KVSCOPE_DATA_DIR set to `env_dir` when given, `environ` added,
    `stdin` as its input."""
    env = dict(os.environ) | dict(environ or {})
    if env_dir is not None:
        env["KVSCOPE_DATA_DIR"] = str(env_dir)
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
        input=stdin,
    )


def spawn(
    *args: str,
    env_dir: Path,
    environ: Mapping[str, str] | None = None,
    stderr: int | None = subprocess.DEVNULL,
) -> subprocess.Popen[str]:
    """`kvscope ARGS` started in the background (a worker, say) on `env_dir`; the caller
    stops it by its PID."""
    env = dict(os.environ) | dict(environ or {}) | {"KVSCOPE_DATA_DIR": str(env_dir)}
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, grace_s: float = 30.0) -> None:
    """Stop a process the tests started, by its PID: `sig`, then SIGKILL after `grace_s`."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
