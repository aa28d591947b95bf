"""`kvscope diagnose`, as a user runs it: a stored target over a period, a bare URL watched
for a window, and the errors (an unreachable URL is exit 2 at once, not a verdict)."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

from sqlalchemy import Engine

from tests.app.test_cli_errors import run
from tests.storage.test_diagnosis import _requests, _target, _write, queueing
from tests.support.fake_vllm import FakeVllm, serve

KEYS = {"cause", "evidence", "runner_up", "window_s"}


def test_a_stored_target_window_by_window(store: Engine, tmp_path: Path) -> None:
    tid = _target(store)
    now = time.time()
    _write(store, tid, queueing, now - 122, now)
    res = run("diagnose", "t", "--since", "2m", "--window", "1m", "--json", data_dir=tmp_path)
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    assert set(found) >= KEYS and found["cause"] == "queueing" and found["window_s"] == 60
    assert [w["cause"] for w in found["windows"]] == ["queueing", "queueing"]
    assert any(e["series"] == "queue share of TTFT" for e in found["evidence"])
    text = run("diagnose", "t", "--since", "2m", "--window", "1m", data_dir=tmp_path)
    assert text.stdout.startswith("t: queueing (requests waited in the queue")


def test_a_bare_url_is_watched_for_its_window_and_judged(tmp_path: Path) -> None:
    fake, stop = FakeVllm(), threading.Event()
    rng = random.Random(0)

    def traffic() -> None:  # a queue builds while kvscope watches
        while not stop.wait(0.2):
            with fake.lock:
                fake.running, fake.waiting = 4, rng.randint(15, 25)
                _requests(fake, 2, 3.0, 2.7, 64)

    worker = threading.Thread(target=traffic, daemon=True)
    with serve(fake) as url:
        worker.start()
        try:
            res = run("diagnose", url, "--window", "6s", "--json", data_dir=tmp_path)
        finally:
            stop.set()
            worker.join()
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    assert found["target"] == url and found["cause"] == "queueing"
    assert 6 <= found["window_s"] < 9 and len(found["windows"]) == 1


def test_an_unreachable_url_is_an_error_not_a_verdict(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run("diagnose", "http://127.0.0.1:1", "--window", "60s", "--json", data_dir=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: cannot connect to http://127.0.0.1:1/metrics")
    assert time.monotonic() - t0 < 30  # refused at once, not after the 60 s window


def test_bad_input_is_named(tmp_path: Path) -> None:
    res = run("diagnose", "nosuch", data_dir=tmp_path)
    assert res.returncode == 2 and "nosuch" in res.stderr
    res = run("diagnose", "t", "--since", "yesterday", data_dir=tmp_path)
    assert res.returncode == 2
    assert "--since 'yesterday': give a length of time such as 90s" in res.stderr
    res = run("diagnose", "http://127.0.0.1:1", "--window", "2s", data_dir=tmp_path)
    assert res.returncode == 2 and "a snapshot needs at least 5 s" in res.stderr
    res = run("diagnose", "http://169.254.169.254", "--window", "10s", data_dir=tmp_path)
    assert res.returncode == 2 and "169.254.169.254" in res.stderr
