"""Shared console plumbing: the pages' error boundary, settings, the cached store, cached
reads and common widgets.

Only `app/` imports Streamlit. Reads are cached briefly (`st.cache_data`) and keyed by the
database URL, so several consoles or tests with different stores never mix.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

import pandas as pd
import streamlit as st
from sqlalchemy import Engine
from streamlit.errors import FragmentHandledException

from planner.cost import retry_amplification
from planner.errors import Forbidden, KvscopeError
from storage import dashboards, queries
from storage.access import Actor
from storage.db import open_store
from storage.schemas import AlertRow, EventRow, RunRow, TargetRow
from storage.settings import Settings

log = logging.getLogger(__name__)

WINDOWS: dict[str, float] = {
    "15 minutes": 900,
    "1 hour": 3600,
    "6 hours": 6 * 3600,
    "24 hours": 86400,
    "7 days": 7 * 86400,
    "30 days": 30 * 86400,
}


P = ParamSpec("P")
R = TypeVar("R")


def actor() -> Actor:
    """Who is acting in this browser session: every guarded action is done as them. Without
    sign-in (the console bound to loopback, one person on their own machine) that is the
    local admin; a browser never owns the machine."""
    from app import auth

    who, why = auth.current()
    if who is None:
        raise Forbidden(why or "sign in first")
    return who


# Every ASCII punctuation character may be backslash-escaped in CommonMark.
_MARKDOWN = re.compile(r"([!-/:-@\[-`{-~])")


def md_text(text: object) -> str:
    """`text` escaped for Streamlit's Markdown: what a target controls (model names, health
    messages, error bodies) shows as typed, never as a link, an image or colour."""
    return _MARKDOWN.sub(r"\\\1", str(text))


PAGE_FAILED = "Something went wrong on this page; the details are in the console's log."


def error_boundary(render: Callable[P, R]) -> Callable[P, R | None]:
    """The console's one error boundary, around every page (app/main.py) and every live
    panel (under `st.fragment`, which reruns without its page).

    A `KvscopeError` is for the user to act on: shown as is. Anything else is a bug: its
    traceback goes to the console's log, the page shows one short line (and None is
    returned). `st.rerun()` and
    `st.stop()` raise Streamlit's BaseException-derived control flow, which `except
    Exception` never sees; a fragment's error Streamlit has already shown passes through.
    """

    @functools.wraps(render)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return render(*args, **kwargs)
        except KvscopeError as err:
            st.error(str(err))
        except FragmentHandledException:
            raise
        except Exception:
            log.exception("page %s.%s failed", render.__module__, render.__qualname__)
            st.error(PAGE_FAILED)
        return None

    return guarded


def settings() -> Settings:
    """Settings from the environment (cheap; read per run so tests can switch stores)."""
    return Settings()


@st.cache_resource(show_spinner=False)
def _store(url: str) -> Engine:
    return open_store(url)


def store() -> Engine:
    """The database engine for the configured URL, created once per process."""
    return _store(settings().db_url)


def db_url() -> str:
    """The configured database URL (the cache key of every read)."""
    return settings().db_url


@st.cache_data(ttl=2, show_spinner=False)
def targets(url: str) -> list[TargetRow]:
    """All targets."""
    return queries.list_targets(_store(url))


@st.cache_data(ttl=2, show_spinner=False)
def overview(url: str) -> list[dashboards.OverviewRow]:
    """Overview rows."""
    return dashboards.overview(_store(url))


@st.cache_data(ttl=2, show_spinner=False)
def open_alerts(url: str) -> list[AlertRow]:
    """Alerts firing now, most severe first."""
    return queries.open_alerts(_store(url))


@st.cache_data(ttl=2, show_spinner=False)
def worker_status(url: str) -> dashboards.WorkerStatus:
    """Worker heartbeat and GPU state."""
    return dashboards.worker_status(_store(url))


@st.cache_data(ttl=2, show_spinner=False)
def live(url: str, target_id: int, start: float, end: float) -> pd.DataFrame:
    """The Live page frame."""
    return dashboards.live(_store(url), target_id, start, end)


@st.cache_data(ttl=2, show_spinner=False)
def tail(url: str, target_id: int, start: float, end: float) -> dict[str, pd.DataFrame]:
    """The Tail page frames."""
    return dashboards.tail(_store(url), target_id, start, end)


@st.cache_data(ttl=15, show_spinner=False)
def open_problems(url: str) -> list[dashboards.Problem]:
    """Targets whose last five minutes name a cause (judged every 15 s at most)."""
    return dashboards.open_problems(_store(url))


@st.cache_data(ttl=30, show_spinner=False)
def diagnosis(url: str, target_id: int, start: float, end: float) -> dashboards.Diagnosis:
    """One target's windows over [start, end], about 48 of them, at least 5 minutes each."""
    window = max(dashboards.DEFAULT_WINDOW_S, (end - start) / 48)
    return dashboards.diagnose(_store(url), target_id, end - start, window, now=end)


@st.cache_data(ttl=60, show_spinner=False)
def violation_windows(url: str, since_s: float) -> list[dashboards.Problem]:
    """SLO-breaking windows of the last `since_s`, each with its cause."""
    return dashboards.violation_windows(_store(url), since_s)


@st.cache_data(ttl=2, show_spinner=False)
def events(url: str, start: float, end: float, target_id: int | None = None) -> list[EventRow]:
    """Events in a window."""
    return queries.events(_store(url), start, end, target_id)


def run(url: str, run_id: int) -> RunRow:
    """A run, uncached: pages poll it for progress."""
    return queries.get_run(_store(url), run_id)


def window_now(seconds: float, refresh_s: float) -> tuple[float, float]:
    """[start, end] of a trailing window, `end` rounded so cached reads are shared."""
    end = float(int(time.time() / refresh_s) * refresh_s)
    return end - seconds, end


def target_picker(rows: list[TargetRow], key: str) -> TargetRow | None:
    """A select box of targets remembered per user; None (with a hint) when there are none."""
    if not rows:
        st.info("No targets yet. Add a vLLM engine on the **Targets** page.")
        return None
    names = [r.name for r in rows]
    chosen = st.session_state.get("target")
    index = names.index(chosen) if chosen in names else 0
    name = st.selectbox("Target", names, index=index, key=key)
    st.session_state["target"] = name
    return rows[names.index(name)]


def window_picker(key: str, default: str = "15 minutes") -> tuple[str, float]:
    """A window selector: 15 minutes to 30 days."""
    label = st.selectbox("Window", list(WINDOWS), index=list(WINDOWS).index(default), key=key)
    return label, WINDOWS[label]


def age(ts: float | None) -> str:
    """'12 s ago' style age of a timestamp."""
    if ts is None:
        return "never"
    s = max(0.0, time.time() - ts)
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def worker_banner() -> None:
    """Warn when no worker is writing: every page would otherwise look frozen."""
    status = worker_status(db_url())
    if not status.alive:
        st.warning(status.message, icon="⚠️")


def retry_panel(failure_share: float, replicas: float | None, key: str) -> None:
    """How a client retry policy multiplies the load at a failure share, and the retry
    budget that bounds it (the Cost and SLOs pages)."""
    st.subheader("What retries do to the load")
    c = st.columns(3)
    fail = c[0].number_input(
        "Share of requests that fail", 0.0, 1.0, value=failure_share, format="%.3f",
        key=f"{key}_retry_fail",
    )  # fmt: skip
    retries = c[1].number_input("Retries a client makes", 0, 20, value=3, key=f"{key}_retries")
    budget = c[2].number_input(
        "Retry budget (retries per request, at most)",
        0.0,
        value=0.1,
        format="%.2f",
        key=f"{key}_retry_budget",
        help="e.g. 0.1: retries may add at most 10% to the requests; with backoff and jitter",
    )
    try:
        free = retry_amplification(fail, int(retries))
        capped = retry_amplification(fail, int(retries), budget)
    except KvscopeError as err:
        st.error(str(err))
        return
    d = st.columns(2)
    for col, title, load in (
        (d[0], "Load without a budget", free.attempts_unbounded),
        (d[1], "Load with the budget", capped.attempts),
    ):
        needs = (
            None
            if replicas is None
            else f"{replicas:g} replicas' traffic needs {replicas * load:.1f}"
        )
        col.metric(title, f"{load:.2f}x", help=needs)
    if capped.budget_binds:
        st.caption(
            "The budget binds: past it, failed requests are not retried, so an overloaded "
            "engine that fails more is not also sent more (the spiral retries start)."
        )
