"""What `make run` runs (`kvscope up`), for real: tiny model, CPU engine, worker, console.

Runs after the session engine is stopped (two CPU engines on two cores would only slow
each other). It checks what the README promises: the console comes up, the embedded engine
becomes healthy and is scraped, its KV usage reaches the Overview page, and Ctrl-C leaves
no process behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from probes.engine import group_pids
from storage import dashboards
from storage import queries as q
from storage.db import open_store
from tests.e2e.browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, chromium_missing
from tests.e2e.conftest import ENGINE_VENV, ROOT
from tests.support.waiting import free_port

pytestmark = [pytest.mark.engine, pytest.mark.browser, pytest.mark.engine_last]


def _groups_running(folder: Path) -> set[int]:
    """Process groups of processes whose command line names `folder`."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(folder).encode() in (proc / "cmdline").read_bytes():
                found.add(os.getpgid(int(proc.name)))
        except (OSError, ProcessLookupError):
            continue
    return found


def test_kvscope_up_brings_the_console_up_on_live_engine_data(tmp_path: Path) -> None:
    missing = chromium_missing()
    if missing:
        pytest.fail(missing)
    console_port, engine_port = free_port(), free_port()
    env = {
        **os.environ,
        "KVSCOPE_DATA_DIR": str(tmp_path),
        "KVSCOPE_CONSOLE_PORT": str(console_port),
        "KVSCOPE_EMBEDDED_PORT": str(engine_port),
        "KVSCOPE_ENGINE_VENV": str(ENGINE_VENV),
    }
    log = open(tmp_path / "up.log", "w")  # noqa: SIM115
    up = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "up"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    store = None
    engine_pgid = None
    try:
        console = f"http://127.0.0.1:{console_port}"
        deadline = time.time() + 600
        while time.time() < deadline:
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            if store is None and (tmp_path / "kvscope.db").exists():
                store = open_store(f"sqlite:///{tmp_path / 'kvscope.db'}")
            if store is not None:
                state = q.get_state(store, "engine:embedded")
                if state and state[0].get("status") == "running":
                    engine_pgid = state[0]["pid"]
                    break
            time.sleep(1)
        else:
            raise AssertionError(f"engine not running: {(tmp_path / 'up.log').read_text()}")
        assert store is not None
        assert httpx.get(f"{console}/_stcore/health", timeout=5).status_code == 200
        while time.time() < deadline:
            rows = q.list_targets(store)
            if rows and rows[0].health == "up" and q.count_samples(store, rows[0].id):
                break
            time.sleep(1)
        target = q.get_target(store, "embedded")
        assert target.health == "up" and target.num_gpu_blocks == 512  # 16 MiB / 32 KiB
        # The Overview's own read: the engine's KV usage has reached it (a number, 0 to 1).
        (row,) = dashboards.overview(store)
        assert row.kv_usage is not None and 0.0 <= row.kv_usage <= 1.0, row
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                str(tmp_path / "profile"),
                executable_path=CHROMIUM,
                headless=True,
                args=CHROMIUM_FLAGS,
                viewport={"width": 1400, "height": 1000},
            )
            page = ctx.new_page()
            page.goto(f"{console}/", timeout=60_000)  # the Overview, with its targets table
            page.wait_for_selector('[data-testid="stDataFrame"]', timeout=60_000)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.goto(f"{console}/live", timeout=60_000)
            page.wait_for_function(
                "() => document.querySelectorAll('.js-plotly-plot').length >= 6", timeout=60_000
            )
            page.wait_for_timeout(2000)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "make-run-live.png"), full_page=True)
            assert page.locator('[data-testid="stException"]').count() == 0
            assert "embedded" in page.inner_text("body")
            ctx.close()
    finally:
        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C in the terminal that ran `make run`
        try:
            up.wait(120)
        except subprocess.TimeoutExpired:
            # Never leave it running for the rest of the session: kill what it started (the
            # engine runs in a group of its own, serving a model under tmp_path).
            groups = {up.pid, *_groups_running(tmp_path)}
            for pgid in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            raise
        finally:
            log.close()
            if store is not None:
                store.dispose()
    assert up.returncode == 0, (tmp_path / "up.log").read_text()
    assert engine_pgid is not None and group_pids(int(engine_pgid)) == []
    assert group_pids(up.pid) == []
