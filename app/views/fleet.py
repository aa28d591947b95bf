"""Fleet page: every replica's KV usage, queue and p99 side by side, the hot one named, and
the pool's totals; filtered and grouped by target labels."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import common
from app.charts import fleet as charts
from planner.errors import KvscopeError
from storage import dashboards
from storage.schemas import parse_labels

REFRESH_S = 5.0


def render() -> None:
    """Draw the page."""
    st.title("Fleet")
    common.worker_banner()
    rows = common.overview(common.db_url())
    if not rows:
        st.info(
            "No targets yet. Add engines on the **Targets** page or with "
            "`kvscope target add NAME URL --label pool=chat`."
        )
        return
    keys = dashboards.label_keys(rows)
    c1, c2 = st.columns(2)
    text = c1.text_input(
        "Only replicas labelled", placeholder="pool=chat, region=eu", key="fleet_selector"
    )
    picked = c2.selectbox("Pools by", ["(all together)", *keys], key="fleet_by")
    try:
        selector = parse_labels(text)
    except KvscopeError as err:
        st.error(str(err))
        return
    _panel(selector, None if picked == "(all together)" else picked)


@st.fragment(run_every=REFRESH_S)
@common.error_boundary
def _panel(selector: dict[str, str], by: str | None) -> None:
    pools = dashboards.fleet(common.overview(common.db_url()), selector, by)
    if not pools:
        st.info("No replica carries those labels.")
        return
    for pool in pools:
        value = common.md_text(pool.value or "(none)")
        st.subheader(f"{by} = {value}" if by else "All replicas selected")
        c = st.columns(5)
        c[0].metric("replicas", len(pool.replicas), f"{pool.down} down" if pool.down else None,
                    delta_color="inverse")  # fmt: skip
        c[1].metric("running", f"{pool.running:g}")
        c[2].metric("waiting", f"{pool.waiting:g}")
        worst = f"max {_share(pool.kv_usage_max)}"
        c[3].metric("KV usage, mean", _share(pool.kv_usage_mean), worst, delta_color="off")
        p99 = "-" if pool.ttft_p99_max_s is None else f"{pool.ttft_p99_max_s * 1000:,.0f} ms"
        c[4].metric("TTFT p99, worst", p99)
        if pool.hot and len(pool.replicas) > 1:
            hot = next(r for r in pool.replicas if r.name == pool.hot)
            st.warning(
                f"The hot one: **{hot.name}** (KV usage {_share(hot.kv_usage)}, "
                f"{hot.waiting or 0:g} waiting).",
                icon="🔥",
            )
        st.plotly_chart(charts.replicas_figure(pool), key=f"fleet_chart_{pool.value}")
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "replica": r.name,
                        "health": r.health,
                        "KV usage": r.kv_usage,
                        "running": r.running,
                        "waiting": r.waiting,
                        "TTFT p99 s (5 min)": r.ttft_p99_s,
                        "ITL p99 s (5 min)": r.itl_p99_s,
                        "preemptions/s": r.preemptions_per_s,
                        "labels": ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items())),
                    }
                    for r in pool.replicas
                ]
            ),
            hide_index=True,
            width="stretch",
            column_config={
                "KV usage": st.column_config.ProgressColumn(
                    "KV usage", min_value=0.0, max_value=1.0, format="percent"
                )
            },
        )


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"
