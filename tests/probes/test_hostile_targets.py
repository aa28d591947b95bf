"""Targets that misbehave the way real ones do: every scrape ends within its deadline plus a
second with a stored reason, and the worker stays small while it scrapes all of them.

The hostile server is loopback only (tests/support/hostile.py); each case is bounded by the
client's limits, so a case that would run forever still ends the test on time.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from planner.errors import TargetError
from probes.vllm.client import Target, VllmClient
from storage import queries as q
from storage.db import open_store
from storage.schemas import ScrapeLimits
from tests.support.cli import kvscope, spawn
from tests.support.fake_vllm import FakeVllm, serve
from tests.support.hostile import CASES, hostile

DEADLINE_S = 2.0
REASONS = {
    "drip": "did not answer in full within 2 s",
    "huge": "the body size limit",
    "slow_headers": "did not answer in full within 2 s",
    "many_series": "100,000 samples, over the sample limit of 20,000",
    "big_labels": "over the label value length limit",
    "redirect_loop": "redirected (HTTP 302)",
    "gzip_bomb": "the body size limit",
    "bad_utf8": "not UTF-8",
    "silent": "did not answer in full within 2 s",
}
WORKER_RSS_LIMIT = 300 * 1024 * 1024


@pytest.fixture(scope="module")
def hostile_url() -> object:
    with hostile() as url:
        yield url


def test_every_case_has_a_reason() -> None:
    assert set(REASONS) == set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_a_scrape_of_a_hostile_target_ends_on_time_with_its_reason(
    hostile_url: str, case: str
) -> None:
    limits = ScrapeLimits(interval_s=DEADLINE_S, timeout_s=DEADLINE_S)
    client = VllmClient(Target(f"{hostile_url}/{case}"))
    t0 = time.monotonic()
    with pytest.raises(TargetError) as err:
        client.scrape(limits.deadline_s, limits)
    took = time.monotonic() - t0
    assert REASONS[case] in str(err.value), str(err.value)
    assert took <= DEADLINE_S + 1.0, (case, took)


def _rss_peak(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_worker_scraping_every_case_stays_small_and_stores_why(
    hostile_url: str, tmp_path: Path
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'kvscope.db'}")
    fake = FakeVllm(kv_usage=0.25)
    with serve(fake) as good:
        for case in CASES:
            q.add_target(store, q.parse_target({"name": case, "base_url": f"{hostile_url}/{case}"}))
        q.add_target(store, q.parse_target({"name": "healthy", "base_url": good}))
        scrape = {"KVSCOPE_SCRAPE__INTERVAL_S": "2", "KVSCOPE_SCRAPE__TIMEOUT_S": str(DEADLINE_S)}
        worker = spawn("worker", env_dir=tmp_path, environ=scrape, stderr=subprocess.PIPE)
        try:
            # Each case is judged on its latest scrape: the first one may meet a machine
            # still busy starting the worker.
            deadline = time.monotonic() + 60
            seen: dict[str, str] = {}
            while time.monotonic() < deadline:
                time.sleep(0.5)
                seen = {
                    t.name: t.health_message or ""
                    for t in q.list_targets(store)
                    if t.name in REASONS and t.health == "down"
                }
                if all(REASONS[c] in seen.get(c, "") for c in CASES):
                    break
            peak = _rss_peak(worker.pid)
        finally:
            worker.send_signal(signal.SIGTERM)
            _, stderr = worker.communicate(timeout=60)
    for case in CASES:
        assert REASONS[case] in seen.get(case, ""), (case, seen.get(case), stderr[-2000:])
    assert q.get_target(store, "healthy").health == "up"
    assert peak < WORKER_RSS_LIMIT, f"worker peak RSS {peak / 2**20:.0f} MiB"
    # Every scrape stored `up` and its duration; none outlasted the deadline by a second.
    for t in q.list_targets(store):
        points = q.series_points(store, t.id, ["scrape_duration_s"], 0, time.time() + 1)
        assert not points.empty, t.name
        assert float(points["value"].max()) <= DEADLINE_S + 1.0, t.name
        up = q.series_points(store, t.id, ["up"], 0, time.time() + 1)
        assert float(up["value"].iloc[-1]) == (1.0 if t.name == "healthy" else 0.0), t.name


@pytest.mark.parametrize(("case", "limit"), [("drip", "within 2 s"), ("huge", "body size limit")])
def test_the_cli_scrape_of_a_hostile_target_exits_2_naming_the_limit(
    hostile_url: str, tmp_path: Path, case: str, limit: str
) -> None:
    # The control: how long the CLI takes to start and exit on this (busy) machine now.
    t0 = time.monotonic()
    assert kvscope("--help", env_dir=tmp_path).returncode == 0
    startup = time.monotonic() - t0
    t0 = time.monotonic()
    res = kvscope("scrape", f"{hostile_url}/{case}", "--timeout", "2", env_dir=tmp_path)
    assert time.monotonic() - t0 <= startup + 2.0 + 2.0  # the deadline plus 2 s
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and limit in last
