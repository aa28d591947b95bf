"""Probes page: start a probe, watch it run, cancel it, read and compare results, schedule.

The page writes requests (a queued run, a cancel, a schedule); the worker runs the probes.
Everything kind-specific (form, chart, table, headline) comes from the kind's module
through the registry, and results are read back typed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pandas as pd
import streamlit as st

from app import common
from app.charts import probes as charts
from planner.errors import InvalidInput, KvscopeError
from probes.kinds import KINDS, AnyKind, ProbeResult, get_kind, requests
from storage import queries
from storage.access import Action, allowed
from storage.schemas import RunRow, TargetRow


def render() -> None:
    """Draw the page."""
    st.title("Probes")
    common.worker_banner()
    targets = common.targets(common.db_url())
    if not targets:
        st.info("No targets yet: add an engine on the **Targets** page first.")
        return
    with st.expander("Start a probe", expanded=True):
        _start_form(targets)
    _running()
    runs = queries.list_runs(common.store(), limit=200)
    done = [r for r in runs if r.kind in KINDS and r.status not in ("queued", "running")]
    names = {t.id: t.name for t in targets}
    if done:
        _history(done, names)
        _result(done, names)
        _compare(done)
    _schedules(targets)


def _title(kind: str) -> str:
    return KINDS[kind].title if kind in KINDS else kind


def _start_form(targets: list[TargetRow]) -> None:
    name = st.selectbox("Probe", list(KINDS), format_func=_title, key="probe_kind")
    kind = get_kind(name)
    target = st.selectbox(
        "Target", targets, format_func=lambda t: f"{t.name} ({t.base_url})", key="probe_target"
    )
    cols = st.columns(len(kind.form))
    data: dict[str, Any] = {}
    for col, f in zip(cols, kind.form, strict=True):
        default = kind.params.model_fields[f.name].default if f.default is None else f.default
        key = f"probe_{name}_{f.name}"
        if isinstance(default, bool):  # a switch (the capacity probe's guided)
            data[f.name] = col.checkbox(f.label, value=default, key=key)
            continue
        data[f.name] = col.number_input(
            f.label,
            value=default,
            key=key,
            min_value=0 if isinstance(default, int) else 0.0,
        )
    extra = st.text_area(
        "Other parameters (JSON)",
        "{}",
        key=f"probe_{name}_extra",
        help='any other parameter of the probe, e.g. {"profile": "code-review", "seed": 3}',
    )
    confirm = None
    if kind.destructive:
        st.warning(
            f"The {kind.title} probe {kind.danger}: it disturbs every request the engine "
            "serves meanwhile."
        )
        confirm = st.text_input(
            f"Type the target's name ({target.name}) to confirm", key=f"{name}_confirm"
        )
        if (
            target is not None
            and not target.managed
            and "allow_external" in kind.params.model_fields
        ):
            data["allow_external"] = st.checkbox(
                f"{target.name} is not managed by kvscope: push it anyway", key=f"{name}_external"
            )
    who = common.actor()
    if st.button(
        "Start",
        type="primary",
        key="probe_start",
        disabled=not allowed(who, Action.PROBE_RUN),
        help=None if allowed(who, Action.PROBE_RUN) else "starting a probe needs an operator",
    ):
        try:
            data |= json.loads(extra or "{}")
            run = requests.request_probe(
                common.store(), who, name, target, data, common.settings().probe_limits, confirm
            )
        except json.JSONDecodeError as err:
            st.error(f"Other parameters are not JSON: {err}")
        except KvscopeError as err:
            st.error(str(err))
        else:
            st.success(f"Queued run {run.id}; the worker starts it within a second.")


@st.fragment(run_every=1.0)
@common.error_boundary
def _running() -> None:
    active = [
        r
        for r in queries.list_runs(common.store(), limit=50)
        if r.kind in KINDS and r.status in ("queued", "running")
    ]
    if not active:
        return
    st.subheader("Running")
    for run in active:
        kind = KINDS[run.kind]
        progress = _progress(kind, run)
        c1, c2 = st.columns([5, 1])
        c1.progress(
            run.progress,
            text=f"run {run.id} · {kind.title} · {run.status} · "
            f"{progress.phase if progress else ''}",
        )
        can = allowed(common.actor(), Action.PROBE_CANCEL)
        if c2.button("Cancel", key=f"cancel_{run.id}", disabled=run.cancel_requested or not can):
            requests.cancel_probe(common.store(), common.actor(), run.id)
        chart = kind.partial_chart(progress) if progress is not None else None
        if chart is not None:
            st.plotly_chart(charts.figure(chart), key=f"live_{run.id}")


def _progress(kind: AnyKind, run: RunRow) -> Any:
    """A running run's typed progress, or None before its first report."""
    partial = run.summary.get("partial")
    if not isinstance(partial, dict):
        return None
    try:
        return kind.read_progress(partial)
    except InvalidInput:
        return None


def result_of(run: RunRow) -> ProbeResult | None:
    """A finished run's typed result; None when it has none (failed early) or cannot be read."""
    if run.kind not in KINDS or not run.summary or "partial" in run.summary:
        return None
    try:
        result: ProbeResult = KINDS[run.kind].read_result(run.summary)
    except InvalidInput:
        return None
    return result


def headline(run: RunRow) -> str:
    """One line saying what a finished run found."""
    if run.status == "failed":
        return run.error or "failed"
    result = result_of(run)
    if result is None:
        return run.error or ""
    return str(KINDS[run.kind].headline(result))


def _history(runs: list[RunRow], names: dict[int, str]) -> None:
    st.subheader("History")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "run": r.id,
                    "probe": _title(r.kind),
                    "target": names.get(r.target_id or -1, r.params.get("target_url", "?")),
                    "status": r.status,
                    "started": common.age(r.started_at),
                    "took": f"{(r.finished_at or 0) - (r.started_at or 0):.0f} s"
                    if r.started_at
                    else "-",
                    "result": headline(r),
                }
                for r in runs
            ]
        ),
        hide_index=True,
        width="stretch",
    )


def _result(runs: list[RunRow], names: dict[int, str]) -> None:
    st.subheader("Result")
    run = st.selectbox(
        "Run",
        runs,
        key="result_run",
        format_func=lambda r: (
            f"{r.id} · {_title(r.kind)} · {names.get(r.target_id or -1, '?')} · {r.status}"
        ),
    )
    if run is None:
        return
    st.text(headline(run))
    result = result_of(run)
    if result is None:
        if run.summary and "partial" not in run.summary:
            st.info("This run's result was stored in a shape this kvscope cannot read.")
        return
    kind = KINDS[run.kind]
    st.plotly_chart(charts.figure(kind.chart(result)), key="res")
    for i, more in enumerate(kind.more_charts(result)):
        st.plotly_chart(charts.figure(more), key=f"res_more_{i}")
    rows = kind.table(result)
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    for note in kind.notes(result):
        st.caption(note)
    if kind.records_cdf:
        _records_cdf(run)


def _records_cdf(run: RunRow) -> None:
    records = queries.run_records(common.store(), run.id)
    ok = records[records["status"] == "ok"]
    if ok.empty:
        return
    c1, c2 = st.columns(2)
    c1.plotly_chart(
        charts.cdf_chart(
            {"TTFT": ok["ttft_s"].tolist(), "E2E": ok["e2e_s"].tolist()}, "Latency CDF"
        ),
        key="cdf_a",
    )
    c2.plotly_chart(
        charts.cdf_chart({"TPOT": ok["tpot_s"].dropna().tolist()}, "TPOT CDF"), key="cdf_b"
    )


def _compare(runs: list[RunRow]) -> None:
    with st.expander("Compare two runs"):
        c1, c2 = st.columns(2)
        a = c1.selectbox("First", runs, format_func=lambda r: f"{r.id} · {r.kind}", key="cmp_a")
        same = [r for r in runs if a is not None and r.kind == a.kind and r.id != a.id]
        if not same:
            st.caption("Only one run of this kind so far.")
            return
        b = c2.selectbox("Second", same, format_func=lambda r: f"{r.id} · {r.kind}", key="cmp_b")
        ra, rb = result_of(a), result_of(b)
        if ra is None or rb is None:
            st.caption("One of these runs has no result to compare.")
            return
        st.dataframe(compare_table(ra, rb, a.id, b.id), hide_index=True)
        if KINDS[a.kind].records_cdf:
            rec_a = queries.run_records(common.store(), a.id)
            rec_b = queries.run_records(common.store(), b.id)
            st.plotly_chart(
                charts.cdf_chart(
                    {
                        f"run {a.id} TTFT": rec_a["ttft_s"].dropna().tolist(),
                        f"run {b.id} TTFT": rec_b["ttft_s"].dropna().tolist(),
                    },
                    "TTFT CDF, both runs",
                ),
                key="cmp_cdf",
            )


def compare_table(a: ProbeResult, b: ProbeResult, a_id: int, b_id: int) -> pd.DataFrame:
    """Numbers of two results side by side: every number and every p50/p95/p99."""
    fa, fb = _figures(a), _figures(b)
    keys = [k for k in fa if k in fb]
    return pd.DataFrame(
        {"figure": keys, f"run {a_id}": [fa[k] for k in keys], f"run {b_id}": [fb[k] for k in keys]}
    )


def _figures(result: ProbeResult) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in result.model_dump().items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
        elif isinstance(value, dict):
            for sub in ("p50", "p95", "p99", "concurrency", "context"):
                inner = value.get(sub)
                if isinstance(inner, int | float) and not isinstance(inner, bool):
                    out[f"{key}.{sub}"] = inner
    return out


def _schedules(targets: list[TargetRow]) -> None:
    with st.expander("Schedules"):
        store = common.store()
        names = {t.id: t.name for t in targets}
        rows = queries.list_schedules(store)
        if rows:
            st.dataframe(
                pd.DataFrame(
                    [
                        {
                            "id": s.id,
                            "probe": _title(s.kind),
                            "target": names.get(s.target_id),
                            "every": f"{s.every_s / 60:g} min",
                            "parameters": json.dumps(s.params),
                        }
                        for s in rows
                    ]
                ),
                hide_index=True,
            )
            gone = st.selectbox(
                "Remove schedule", [None] + [s.id for s in rows], key="sched_remove"
            )
            if gone is not None and st.button("Remove", key="sched_remove_btn"):
                requests.remove_schedule(store, common.actor(), gone)
                st.rerun()
        with st.form("add_schedule"):
            name = st.selectbox(
                "Probe", [k for k, v in KINDS.items() if not v.destructive], format_func=_title
            )
            target = st.selectbox("Target", targets, format_func=lambda t: t.name)
            every = st.number_input("Every (minutes)", min_value=1.0, value=10.0)
            params = st.text_area("Parameters (JSON)", '{"rate": 1, "duration_s": 20}')
            if st.form_submit_button("Add schedule"):
                try:
                    data = json.loads(params or "{}")
                    limits = common.settings().probe_limits
                    requests.add_schedule(
                        store, common.actor(), name, target, data, every * 60, limits
                    )
                except json.JSONDecodeError as err:
                    st.error(f"Parameters are not JSON: {err}")
                except KvscopeError as err:
                    st.error(str(err))
                else:
                    st.success(f"The worker runs it every {every:g} minutes.")
                    time.sleep(0.2)
                    st.rerun()
