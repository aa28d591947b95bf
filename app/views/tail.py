"""Tail page: TTFT, ITL, TPOT, E2E and queue time at p50/p95/p99 over time, and p99/p50."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import common
from app.charts import timeseries as charts
from storage.names import METRICS
from storage.schemas import TargetRow

RATIO_WARN = 3.0


def render() -> None:
    """Draw the page."""
    st.title("Tail latency")
    common.worker_banner()
    url = common.db_url()
    c1, c2 = st.columns([2, 1])
    with c1:
        target = common.target_picker(common.targets(url), key="tail_target")
    with c2:
        _, window = common.window_picker("tail_window", default="1 hour")
    if target is None:
        return
    _charts(target, window)


def _charts(target: TargetRow, window: float) -> None:
    refresh = 5.0 if window <= 6 * 3600 else 60.0

    @st.fragment(run_every=refresh)
    @common.error_boundary
    def panel() -> None:
        start, end = common.window_now(window, refresh)
        frames = common.tail(common.db_url(), target.id, start, end)
        any_frame = next(iter(frames.values()))
        st.caption(
            f"Percentiles from vLLM's own histograms, each point over the trailing "
            f"{any_frame.attrs.get('window_s', 300) / 60:.0f} minutes (bucket-interpolated as "
            "Prometheus' histogram_quantile does)."
        )
        latest = []
        for h, frame in frames.items():
            last = frame.dropna(subset=["p50"]).tail(1)
            row: dict[str, object] = {"metric": METRICS[h].title}
            for col in ("p50", "p95", "p99", "ratio", "count"):
                row[col] = float(last[col].iloc[0]) if len(last) else None
            latest.append(row)
        st.dataframe(
            pd.DataFrame(latest),
            hide_index=True,
            width="stretch",
            column_config={
                c: st.column_config.NumberColumn(format="%.4f") for c in ("p50", "p95", "p99")
            }
            | {
                "ratio": st.column_config.NumberColumn("p99/p50", format="%.2f"),
                "count": st.column_config.NumberColumn("requests in window", format="%d"),
            },
        )
        # Judged once a minute (windows of 5 minutes at least): cached across refreshes.
        judged_end = float(int(end // 60) * 60)
        found = common.diagnosis(common.db_url(), target.id, judged_end - (end - start), judged_end)
        bands = [(w.start, w.end, w.cause) for w in found.windows]
        problems = [w for w in found.windows if w.cause != "none"]
        if problems:
            st.caption(
                f"Shaded: the {len(problems)} of {len(found.windows)} windows of "
                f"{found.window_s / 60:.0f} min whose signals name a cause (the diagnosis; "
                "`kvscope diagnose` prints its evidence)."
            )
        st.plotly_chart(
            charts.cause_bands(charts.ratio_chart(frames, alert_at=RATIO_WARN), bands), key="ratio"
        )
        cols = st.columns(2)
        for i, (h, frame) in enumerate(frames.items()):
            fig = charts.cause_bands(charts.quantile_chart(frame, h), bands)
            cols[i % 2].plotly_chart(fig, key=f"q_{h}")

    panel()
