"""Secrets never leave their place: with the session's engine given an API key and an
HF_TOKEN (by reference), a target probed with its token by the worker and from the CLI,
neither secret is in any file of the data directory (database, WAL, logs, pid files,
caches) nor in the text of any console page."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from storage import queries as q
from storage.settings import Settings
from tests.e2e.conftest import API_KEY, HF_TOKEN, LiveWorker
from tests.support.cli import kvscope
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

PAGES = (
    "overview", "fleet", "live", "tail", "probes", "alerts", "planner", "whatif", "slos", "cost",
    "engine", "targets", "audit",
)  # fmt: skip


def _text(node: object) -> str:
    """Everything a page sent to the browser, as text (its elements' protos)."""
    proto = getattr(node, "proto", None)
    parts = [str(proto)] if proto is not None else []
    children = getattr(node, "children", {}) or {}
    parts += [_text(child) for child in children.values()]
    return "\n".join(parts)


def test_no_secret_in_the_data_directory_or_on_any_page(
    live: LiveWorker, cpu_engine: str, e2e_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_TOKEN_E2E_SECRETS", API_KEY)
    store = live.worker.store
    target = {"name": "secretive", "base_url": cpu_engine, "token_env": "KVSCOPE_TOKEN_E2E_SECRETS"}
    q.add_target(store, q.parse_target(target))
    try:
        wait_until(lambda: q.get_target(store, "secretive").health == "up", 60, "secretive up")
        run = live.request(
            "latency", target="secretive", rate=2, duration_s=3, prompt_tokens=32, output_tokens=8
        )
        assert run.status == "done" and run.summary["errors"] == 0, run.error
        args = ("--rate", "2", "--duration", "2", "--prompt-tokens", "16", "--output-tokens", "4")
        cli = kvscope(
            "probe", "latency", "--target", "secretive", *args, env_dir=e2e_settings.data_dir,
            environ={"KVSCOPE_TOKEN_E2E_SECRETS": API_KEY}, timeout=300,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert API_KEY not in cli.stdout + cli.stderr

        # grep in its own process: closing a file this process also holds open through
        # SQLite would drop SQLite's POSIX locks on it (and break the live worker's store).
        files = [p for p in Path(e2e_settings.data_dir).rglob("*") if p.is_file()]
        assert len(files) > 10 and (e2e_settings.data_dir / "kvscope.db") in files
        for secret in (API_KEY, HF_TOKEN):
            found = subprocess.run(
                ["grep", "-rlaF", "--devices=skip", secret, str(e2e_settings.data_dir)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert found.returncode == 1, f"{secret[:4]}… found in {found.stdout}{found.stderr}"

        monkeypatch.setenv("KVSCOPE_DATA_DIR", str(e2e_settings.data_dir))
        for page in PAGES:
            at = AppTest.from_string(
                f"from app.common import error_boundary\nfrom app.views import {page}\n"
                f"error_boundary({page}.render)()",
                default_timeout=120,
            ).run()
            assert not at.exception, (page, [e.message for e in at.exception])
            text = _text(at._tree)
            assert len(text) > 200, page
            for secret in (API_KEY, HF_TOKEN):
                assert secret not in text, f"{secret[:4]}… shown on the {page} page"
    finally:
        q.remove_target(store, "secretive")
