"""Live page: KV usage and free blocks, queues, preemptions, tokens and prefix hits over time."""

from __future__ import annotations

import streamlit as st

from app import common
from app.charts import timeseries as charts
from storage.schemas import TargetRow


def _refresh_s(window: float) -> float:
    return 5.0 if window <= 6 * 3600 else 60.0


def render() -> None:
    """Draw the page."""
    st.title("Live")
    common.worker_banner()
    url = common.db_url()
    c1, c2 = st.columns([2, 1])
    with c1:
        target = common.target_picker(common.targets(url), key="live_target")
    with c2:
        _, window = common.window_picker("live_window")
    if target is None:
        return
    _charts(target, window)


def _charts(target: TargetRow, window: float) -> None:
    @st.fragment(run_every=_refresh_s(window))
    @common.error_boundary
    def panel() -> None:
        start, end = common.window_now(window, _refresh_s(window))
        frame = common.live(common.db_url(), target.id, start, end)
        res = frame.attrs.get("resolution", 0)
        source = (
            "raw samples"
            if res == 0
            else f"{res // 60}-minute rollups"
            if res == 60
            else "1-hour rollups"
        )
        st.caption(
            f"{target.name} · {source}, one point per {frame.attrs.get('step', 0):.0f} s;"
            f" rates over {frame.attrs.get('rate_window_s', 0):.0f} s windows"
        )
        left, right = st.columns(2)
        left.plotly_chart(
            charts.timeseries(
                frame,
                {"kv_usage": "KV usage"},
                "KV cache usage",
                "used",
                percent=True,
                secondary={"free_blocks": "free blocks"},
            ),
            key="kv",
        )
        right.plotly_chart(
            charts.timeseries(
                frame,
                {"running": "running", "waiting": "waiting"},
                "Requests in the engine",
                "requests",
            ),
            key="queue",
        )
        left.plotly_chart(
            charts.timeseries(
                frame, {"preemptions_per_s": "preemptions/s"}, "Preemptions", "per second"
            ),
            key="preempt",
        )
        right.plotly_chart(
            charts.timeseries(
                frame,
                {"prompt_tokens_per_s": "prompt", "generation_tokens_per_s": "generation"},
                "Tokens per second",
                "tokens/s",
            ),
            key="tokens",
        )
        left.plotly_chart(
            charts.timeseries(
                frame,
                {"prefix_hit_rate": "hit rate"},
                "Prefix cache hit rate",
                "hits / queries",
                percent=True,
            ),
            key="prefix",
        )
        right.plotly_chart(
            charts.timeseries(
                frame, {"requests_per_s": "finished"}, "Finished requests", "per second"
            ),
            key="finished",
        )
        if target.num_gpu_blocks is None:
            st.caption(
                "Free blocks need vllm:cache_config_info, which this engine has not exposed yet."
            )

    panel()
