"""The engine's crash policy as pure decisions: restarts, backoff, giving up, health timing."""

from __future__ import annotations

import pytest

from probes.engine.supervision import (
    CRASH_WINDOW_S,
    MAX_CRASHES,
    START_TIMEOUT_S,
    UNHEALTHY_RESTART_S,
    CrashPolicy,
)


def test_backoff_doubles_from_5_s_and_gives_up_after_5_crashes_in_the_window() -> None:
    policy = CrashPolicy()
    verdicts = [policy.record_crash(100.0 + i) for i in range(MAX_CRASHES)]
    assert [v.delay_s for v in verdicts[:-1]] == [5.0, 10.0, 20.0, 40.0]
    assert [v.crashes for v in verdicts] == [1, 2, 3, 4, 5]
    assert not any(v.give_up for v in verdicts[:-1]) and verdicts[-1].give_up
    assert policy.next_restart == 103.0 + 40.0  # set by the last restart, not by giving up


def test_crashes_older_than_the_window_are_forgotten() -> None:
    policy = CrashPolicy()
    for i in range(MAX_CRASHES - 1):
        policy.record_crash(float(i))
    late = policy.record_crash(CRASH_WINDOW_S + 10.0)
    assert not late.give_up and late.crashes == 1 and late.delay_s == 5.0


def test_backoff_is_capped_at_5_minutes() -> None:
    policy = CrashPolicy(max_crashes=100)
    delays = [policy.record_crash(float(i)).delay_s for i in range(10)]
    assert delays[-1] == 300.0 and max(delays) == 300.0


@pytest.mark.parametrize(
    ("status", "desired", "alive", "now", "start"),
    [
        ("stopped", "running", False, 0.0, True),
        ("stopped", "running", True, 0.0, False),  # the old group still exits: wait for it
        ("stopped", "stopped", False, 0.0, False),
        ("crashed", "running", False, 49.0, False),  # backing off until 50
        ("crashed", "running", False, 50.0, True),
        ("crashed", "stopped", False, 99.0, False),
        ("failed", "running", False, 99.0, False),  # given up: only a request starts it
        ("stopping", "running", False, 99.0, False),
    ],
)
def test_when_an_engine_that_is_not_running_starts(
    status: str, desired: str, alive: bool, now: float, start: bool
) -> None:
    policy = CrashPolicy(next_restart=50.0)
    assert policy.should_start(status, desired, alive, now) is start


def test_a_running_engine_crashes_after_a_minute_of_failed_health_checks() -> None:
    policy = CrashPolicy()
    assert policy.crash_reason("running", False, 0.0, 1000.0) is None
    assert policy.crash_reason("running", False, 0.0, 1000.0 + UNHEALTHY_RESTART_S) is None
    why = policy.crash_reason("running", False, 0.0, 1001.0 + UNHEALTHY_RESTART_S)
    assert why == "health check failed for 60 s"


def test_a_passed_check_starts_the_unhealthy_time_over() -> None:
    policy = CrashPolicy()
    policy.crash_reason("running", False, 0.0, 1000.0)
    policy.healthy()
    assert policy.crash_reason("running", False, 0.0, 1070.0) is None
    assert policy.unhealthy_since == 1070.0


def test_a_starting_engine_crashes_when_not_healthy_after_the_start_timeout() -> None:
    policy = CrashPolicy()
    assert policy.crash_reason("starting", False, 10.0, START_TIMEOUT_S + 10) is None
    assert policy.crash_reason("starting", False, 10.0, START_TIMEOUT_S + 11) == (
        "not healthy 600 s after start"
    )
    assert policy.crash_reason("starting", False, None, 1e9) is None


def test_an_adopted_engine_that_answers_is_not_crashed_for_its_age() -> None:
    # Adoption keeps the original start time; an engine that answers now is running.
    policy = CrashPolicy()
    assert policy.crash_reason("starting", True, 10.0, START_TIMEOUT_S * 5) is None
