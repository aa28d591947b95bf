"""Run the real console (Streamlit) and drive it with Debian's headless Chromium (Playwright).

No browser download: Playwright launches /usr/bin/chromium with the flags that keep it
quiet on a closed network, in a fresh profile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.waiting import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("KVSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not shutil.which(CHROMIUM):
        return f"{CHROMIUM} is not installed (Debian package 'chromium'; .ci/run installs it)"
    return None


@contextmanager
def console(data_dir: Path, environ: dict[str, str] | None = None) -> Iterator[str]:
    """Start `kvscope console` on a free port for a data dir (with `environ` added); yield
    its loopback URL; stop it by PID."""
    port = free_port()
    env = {**os.environ, **(environ or {})}
    env |= {"KVSCOPE_DATA_DIR": str(data_dir), "KVSCOPE_CONSOLE_PORT": str(port)}
    log = open(data_dir / "console.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "console"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"console exited: {(data_dir / 'console.log').read_text()}")
            time.sleep(0.3)
        else:
            raise RuntimeError("console did not become healthy in 60 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
