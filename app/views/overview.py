"""Overview page: every target's health, KV usage, queues, preemptions and tail at a glance."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from app import common
from storage import dashboards

REFRESH_S = 5.0


@st.fragment(run_every=REFRESH_S)
@common.error_boundary
def _panel() -> None:
    url = common.db_url()
    rows = common.overview(url)
    status = common.worker_status(url)
    if not status.alive:
        st.warning(status.message, icon="⚠️")
    if status.disk_warning:
        st.error(status.disk_warning, icon="💾")
    if not rows:
        st.info(
            "No targets yet. Add a vLLM engine URL on the **Targets** page, "
            "or run `kvscope target add NAME URL`."
        )
    else:
        keys = dashboards.label_keys(rows)
        by = None
        if keys:
            picked = st.selectbox(
                "Group by", ["(none)", *keys], key="overview_group_by", help="a target label"
            )
            by = None if picked == "(none)" else picked
        for pool in dashboards.fleet(rows, None, by):
            if by:
                value = common.md_text(pool.value or "(none)")
                st.markdown(f"**{by} = {value}** · {common.md_text(_totals(pool))}")
            _table(pool.replicas)
        down = [r for r in rows if r.health == "down"]
        for r in down:
            st.error(f"**{r.name}** is down: {common.md_text(r.health_message)}")
        _why(url)
    _alerts_and_events(url, status)


def _totals(pool: dashboards.Pool) -> str:
    kv = "-" if pool.kv_usage_mean is None else f"{pool.kv_usage_mean:.0%}"
    return (
        f"{len(pool.replicas)} replicas, {pool.running:g} running, {pool.waiting:g} waiting, "
        f"KV usage {kv} on average"
        + (f", {pool.down} down" if pool.down else "")
        + (f"; the hot one: {pool.hot}" if pool.hot and len(pool.replicas) > 1 else "")
    )


def _table(rows: list[dashboards.OverviewRow]) -> None:
    table = pd.DataFrame(
        [
            {
                "target": r.name,
                "health": r.health,
                "KV usage": r.kv_usage,
                "running": r.running,
                "waiting": r.waiting,
                "preemptions/s (5 min)": r.preemptions_per_s,
                "TTFT p99 s (5 min)": r.ttft_p99_s,
                "ITL p99 s (5 min)": r.itl_p99_s,
                "KV blocks": r.num_gpu_blocks,
                "model": r.model_name,
                "last scrape": common.age(r.last_scrape_at),
                "labels": ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items())),
                "message": r.health_message or "",
            }
            for r in rows
        ]
    )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "KV usage": st.column_config.ProgressColumn(
                "KV usage",
                min_value=0.0,
                max_value=1.0,
                format="percent",
                help="vllm:kv_cache_usage_perc, latest scrape",
            ),
            "preemptions/s (5 min)": st.column_config.NumberColumn(format="%.3f"),
            "TTFT p99 s (5 min)": st.column_config.NumberColumn(
                format="%.3f", help="from vLLM's histogram over the last 5 minutes"
            ),
            "ITL p99 s (5 min)": st.column_config.NumberColumn(format="%.4f"),
        },
    )


def _alerts_and_events(url: str, status: dashboards.WorkerStatus) -> None:
    causes = {p.target: p.verdict.cause for p in common.open_problems(url)}
    for alert in common.open_alerts(url):
        show = {"critical": st.error, "warning": st.warning}.get(alert.severity, st.info)
        cause = causes.get(alert.target)
        show(
            f"**{alert.rule}** on {alert.target}, for {common.age(alert.started_at)}: "
            f"{common.md_text(alert.message)}"
            + (f" Likely cause now: **{cause}**." if cause else "")
        )
    st.caption(f"GPUs on the worker's host: {status.gpu_message}")
    if status.gpus:
        st.dataframe(pd.DataFrame(status.gpus), hide_index=True)
    now = time.time()
    evs = common.events(url, now - 3600, now + 1)
    st.subheader("Events, last hour")
    if evs:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "time": common.age(e.ts),
                        "severity": e.severity,
                        "kind": e.kind,
                        "message": e.message,
                        "by": e.actor or "",
                    }
                    for e in evs[:50]
                ]
            ),
            hide_index=True,
            width="stretch",
        )
    else:
        st.caption("No events in the last hour.")


def _why(url: str) -> None:
    """Per target with a problem in its last five minutes: the cause and its evidence."""
    for p in common.open_problems(url):
        v = p.verdict
        st.warning(
            f"**{common.md_text(p.target)}**, last {v.window_s / 60:.0f} min: "
            f"**{v.cause}**: {v.explanation}. Evidence: {v.summary}. "
            f"Runner-up: {v.runner_up}.",
            icon="🔎",
        )


def render() -> None:
    """Draw the page."""
    st.title("Overview")
    _panel()
