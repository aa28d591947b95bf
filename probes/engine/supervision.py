"""The crash policy of a managed engine, as decisions over times and counts: when a stopped
or crashed engine starts again, when a live one counts as crashed, and how long to wait after
a crash (5 s doubling, at most 5 min; given up after 5 crashes in 15 minutes). No I/O, no
clock: every method takes `now`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

START_TIMEOUT_S = 600.0
UNHEALTHY_RESTART_S = 60.0
CRASH_WINDOW_S = 900.0
MAX_CRASHES = 5
FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0


@dataclass(frozen=True)
class CrashVerdict:
    """What a crash leads to: a restart after `delay_s`, or giving up (`give_up`)."""

    crashes: int  # in the window, this one included
    give_up: bool
    delay_s: float = 0.0


@dataclass
class CrashPolicy:
    """One engine's crash history and health timing."""

    crash_window_s: float = CRASH_WINDOW_S
    max_crashes: int = MAX_CRASHES
    unhealthy_restart_s: float = UNHEALTHY_RESTART_S
    start_timeout_s: float = START_TIMEOUT_S
    crashes: deque[float] = field(default_factory=deque)
    next_restart: float = 0.0
    unhealthy_since: float | None = None

    def should_start(self, status: str, desired: str, alive: bool, now: float) -> bool:
        """Whether an engine that is not running is to be started now."""
        if desired != "running":
            return False
        if status == "stopped":
            return not alive  # a group still exiting would hold the port
        return status == "crashed" and now >= self.next_restart

    def healthy(self) -> None:
        """A health check passed (or a new process started): unhealthy time starts over."""
        self.unhealthy_since = None

    def crash_reason(
        self, status: str, healthy: bool, started_at: float | None, now: float
    ) -> str | None:
        """Why a live engine counts as crashed, given its status from before the health check."""
        if status == "running" and not healthy:
            if self.unhealthy_since is None:
                self.unhealthy_since = now
            if now - self.unhealthy_since > self.unhealthy_restart_s:
                return f"health check failed for {self.unhealthy_restart_s:.0f} s"
        elif (
            status == "starting"
            and not healthy  # an adopted engine that answers now is not a crash
            and started_at
            and now - started_at > self.start_timeout_s
        ):
            return f"not healthy {self.start_timeout_s:.0f} s after start"
        return None

    def record_crash(self, now: float) -> CrashVerdict:
        """Count a crash in the window: give up at `max_crashes`, else back off (doubling)."""
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > self.crash_window_s:
            self.crashes.popleft()
        n = len(self.crashes)
        if n >= self.max_crashes:
            return CrashVerdict(n, give_up=True)
        delay = min(FIRST_BACKOFF_S * 2 ** (n - 1), MAX_BACKOFF_S)
        self.next_restart = now + delay
        return CrashVerdict(n, give_up=False, delay_s=delay)
