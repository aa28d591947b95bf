"""A snapshot diagnosis of an engine kvscope does not watch: scrape its URL for a window
into a throwaway store, as the worker would, and judge that window.

The first scrape is made at once, so an unreachable URL is an error before any waiting,
never a verdict. The store lives in a temporary folder and is gone afterwards.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

from sqlalchemy import Engine

from probes.vllm.client import Target, VllmClient
from probes.worker.scraping import TargetScraper
from storage import queries as q
from storage.dashboards.diagnosis import Diagnosis, diagnose
from storage.db import open_store
from storage.outbound import Allowlist
from storage.settings import Settings

MIN_WINDOW_S = 5.0


def snapshot(
    base_url: str,
    window_s: float,
    settings: Settings,
    allow: Allowlist,
    token_env: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> Diagnosis:
    """Scrape `base_url` at the worker's interval for `window_s` seconds and judge the window.

    Raises TargetError (or TargetAuthError) when the first scrape fails."""
    from planner.errors import InvalidInput

    if window_s < MIN_WINDOW_S:
        raise InvalidInput(f"--window {window_s:g} s: a snapshot needs at least {MIN_WINDOW_S:g} s")
    limits = settings.scrape
    VllmClient(Target.resolve(base_url, token_env, allow=allow)).metrics_text(
        limits.deadline_s, limits.body_limit_bytes
    )
    with tempfile.TemporaryDirectory(prefix="kvscope-snapshot-") as folder:
        store = open_store(f"sqlite:///{folder}/snapshot.db")
        try:
            return _watch(store, base_url, window_s, settings, allow, token_env, progress)
        finally:
            store.dispose()


def _watch(
    store: Engine,
    base_url: str,
    window_s: float,
    settings: Settings,
    allow: Allowlist,
    token_env: str | None,
    progress: Callable[[float], None] | None,
) -> Diagnosis:
    spec = {"name": "snapshot", "base_url": base_url, "token_env": token_env}
    target = q.add_target(store, q.parse_target(spec))
    scraper = TargetScraper(store, settings)
    scraper.allow = allow
    start = time.time()
    scraper.scrape(target.id)
    while (left := start + window_s - time.time()) > 0:
        time.sleep(min(settings.scrape.interval_s, left))
        scraper.scrape(target.id)
        if progress:
            progress(min(1.0, (time.time() - start) / window_s))
    end = time.time()
    found = diagnose(store, target.id, end - start, end - start, now=end, use_baseline=False)
    return found.model_copy(update={"target": base_url})
