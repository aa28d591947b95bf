"""SLOs page: the promises, compliance two ways (exact and bucket-bounded), error budgets.

Product owners set the promise here; the worker's alert rules use its bounds, and the
Cost page weighs breaking it against the price of headroom.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import common
from planner.errors import KvscopeError
from planner.slo import slo_presets
from storage import queries
from storage.access import changes
from storage.dashboards import slo_reports
from storage.schemas import TargetRow


def render() -> None:
    """Draw the page."""
    st.title("SLOs")
    common.worker_banner()
    store = common.store()
    _reports()
    _violations()
    targets = common.targets(common.db_url())
    with st.expander("Add or change an SLO", expanded=not queries.list_slos(store)):
        _form(targets)
    slos = queries.list_slos(store)
    if slos:
        with st.expander("Remove an SLO"):
            name = st.selectbox("SLO", [n for _, n, _, _ in slos], key="slo_remove")
            sure = st.checkbox(
                "Remove it (the alert rules fall back to their own bounds)", key="slo_remove_sure"
            )
            if st.button("Remove", disabled=not sure, key="slo_remove_btn"):
                changes.remove_slo(store, common.actor(), name)
                st.rerun()
    with st.expander("What retries do to the load when the SLO breaks"):
        common.retry_panel(_worst_bad_share(), None, key="slos")
    with st.expander("MLPerf Inference presets and where they come from"):
        st.dataframe(
            pd.DataFrame(
                [
                    {"preset": k, "promise": p.describe(), "source": p.source}
                    for k, p in slo_presets().items()
                ]
            ),
            hide_index=True,
        )


VIOLATIONS_SINCE_S = 6 * 3600.0


def _worst_bad_share() -> float:
    """The largest share outside an SLO now (exact where probes measured it, else the
    histograms' pessimistic bound): where the retry panel starts; 0.2 without data."""
    shares = [
        1.0 - share
        for r in slo_reports(common.store())
        if (share := r.exact_share if r.exact_share is not None else r.histogram_lower) is not None
    ]
    return round(max(shares), 3) if shares else 0.2


@st.fragment(run_every=60.0)
@common.error_boundary
def _violations() -> None:
    """Each 5-minute window of the last 6 hours that broke an SLO, and what broke it."""
    found = common.violation_windows(common.db_url(), VIOLATIONS_SINCE_S)
    if not found:
        return
    st.subheader("Why the SLO broke (last 6 hours)")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "target": p.target,
                    "window ending": common.age(p.verdict.end),
                    "cause": p.verdict.cause,
                    "score": p.verdict.score,
                    "evidence": p.verdict.summary,
                    "runner-up": p.verdict.runner_up,
                }
                for p in found
            ]
        ),
        hide_index=True,
        width="stretch",
        column_config={
            "cause": st.column_config.TextColumn(
                help="the dominant cause in the engine's own signals over the window: "
                "down, errors, kv_pressure, queueing, prefill_interference, decode_slowdown"
            ),
            "score": st.column_config.NumberColumn(
                format="%.2f", help="0.5 or more: enough alone to break the tail"
            ),
        },
    )


@st.fragment(run_every=10.0)
@common.error_boundary
def _reports() -> None:
    reports = slo_reports(common.store())
    if not reports:
        st.info("No SLO yet. Add one below, from an MLPerf preset or your own bounds.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "SLO": r.slo,
                    "target": r.target,
                    "promise": r.promise,
                    "exact (probe requests)": r.exact_share,
                    "requests": r.records,
                    "engine histograms, at least": r.histogram_lower,
                    "engine histograms, at most": r.histogram_upper,
                    "histogram reading": r.histogram_label,
                    "budget spent": r.budget_spent,
                    "burn rate (last hour)": r.burn_rate,
                    "budget from": r.budget_source,
                }
                for r in reports
            ]
        ),
        hide_index=True,
        width="stretch",
        column_config={
            "exact (probe requests)": st.column_config.ProgressColumn(
                format="percent",
                min_value=0.0,
                max_value=1.0,
                help="share inside both bounds among the requests kvscope's probes sent: exact",
            ),
            "engine histograms, at least": st.column_config.NumberColumn(
                format="percent",
                help="the engine's TTFT and per-token histograms are separate "
                "and bucketed: the joint share is only known to lie in this range",
            ),
            "engine histograms, at most": st.column_config.NumberColumn(format="percent"),
            "budget spent": st.column_config.NumberColumn(
                format="percent",
                help="bad requests over the allowance (1 - share), over the SLO's window",
            ),
            "burn rate (last hour)": st.column_config.NumberColumn(
                format="%.2f",
                help="the last hour's bad share over the allowance: at 1.0 the budget lasts "
                "exactly the window; Google's SRE workbook pages at 14.4 (2% of a 30-day "
                "budget in one hour)",
            ),
        },
    )
    st.caption(
        "Exact compliance counts the requests kvscope's probes sent in the window. "
        "The engine's histograms cover all traffic but only bound the share: each "
        "bound between two bucket edges widens it, and the two histograms cannot tell "
        "which requests met both (Fréchet bounds). See docs/slo.md."
    )


def _form(targets: list[TargetRow]) -> None:
    presets = slo_presets()
    key = st.selectbox("Start from", ["(your own bounds)", *presets], key="slo_preset")
    base = presets.get(key)
    with st.form("slo_form"):
        c = st.columns(3)
        name = c[0].text_input("Name", base.name if base else "")
        target = c[1].selectbox(
            "Applies to",
            [None, *targets],
            format_func=lambda t: "every target" if t is None else t.name,
        )
        klass = c[2].selectbox(
            "Request class",
            ["interactive", "batch"],
            index=0 if not base or base.request_class == "interactive" else 1,
        )
        d = st.columns(4)
        ttft = d[0].number_input(
            "TTFT bound (s)", min_value=0.0, value=base.ttft_s if base else 2.0, format="%.3f"
        )
        per_token = d[1].selectbox(
            "Per-token bound on",
            ["tpot", "itl"],
            index=0 if not base or base.per_token == "tpot" else 1,
        )
        tpot = d[2].number_input(
            "Per-token bound (s)", min_value=0.0, value=base.tpot_s if base else 0.1, format="%.3f"
        )
        share = d[3].number_input(
            "Share inside both",
            min_value=0.0,
            max_value=1.0,
            value=base.share if base else 0.99,
            format="%.3f",
        )
        window = st.number_input(
            "Window (hours)", min_value=0.01, value=(base.window_s if base else 86400.0) / 3600
        )
        if st.form_submit_button("Save SLO"):
            try:
                slo = changes.save_slo(
                    common.store(),
                    common.actor(),
                    {
                        "name": name,
                        "ttft_s": ttft,
                        "tpot_s": tpot,
                        "per_token": per_token,
                        "share": share,
                        "window_s": window * 3600,
                        "request_class": klass,
                        "source": base.source if base else "set by hand",
                    },
                    target,
                )
            except KvscopeError as err:
                st.error(str(err))
            else:
                st.success(f"Saved: {slo.describe()}")
