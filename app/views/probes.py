"""Probes page: start a probe, watch it run, cancel it, read and compare results, schedule.

The page writes requests (a queued run, a cancel, a schedule); the worker runs the probes.
Results are drawn from each run's stored summary and request records.
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
from probes.runner import PROBES, parse_params
from storage import queries
from storage.schemas import RunRow, TargetRow

TITLES = {
    "latency": "Latency",
    "batch_sweep": "Batch sweep",
    "oom": "OOM (context frontier)",
    "kv_usage": "KV usage",
    "capacity": "Capacity (SLO)",
}
# The fields each probe's form shows; everything else goes in the JSON box. A form default
# is the probe's own (its Params) unless the probe has none (required, or a profile instead).
FIELDS: dict[str, list[tuple[str, str, float | int | None]]] = {
    "latency": [
        ("rate", "requests per second", None),
        ("duration_s", "seconds", None),
        ("prompt_tokens", "prompt tokens", 256),
        ("output_tokens", "output tokens", 64),
    ],
    "batch_sweep": [
        ("max_concurrency", "largest concurrency", None),
        ("prompt_tokens", "prompt tokens", None),
        ("output_tokens", "output tokens", None),
    ],
    "oom": [
        ("batch", "concurrent sequences", None),
        ("start_context", "first context", None),
        ("step", "tokens added per step", None),
        ("output_tokens", "output tokens", None),
    ],
    "kv_usage": [
        ("rate", "requests per second", None),
        ("duration_s", "seconds of load", None),
        ("prefix_tokens", "shared prefix tokens", None),
        ("output_tokens", "output tokens", None),
    ],
    "capacity": [
        ("ttft_slo_s", "TTFT bound (s)", 2.0),
        ("tpot_slo_s", "TPOT bound (s)", 0.1),
        ("share", "share inside both", None),
        ("duration_s", "seconds per rate", None),
    ],
}


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
    done = [r for r in runs if r.kind in PROBES and r.status not in ("queued", "running")]
    names = {t.id: t.name for t in targets}
    if done:
        _history(done, names)
        _result(done, names)
        _compare(done)
    _schedules(targets)


def _start_form(targets: list[TargetRow]) -> None:
    kind = st.selectbox(
        "Probe", list(PROBES), format_func=lambda k: TITLES.get(k, k), key="probe_kind"
    )
    target = st.selectbox(
        "Target", targets, format_func=lambda t: f"{t.name} ({t.base_url})", key="probe_target"
    )
    cols = st.columns(len(FIELDS[kind]))
    data: dict[str, Any] = {}
    for col, (name, label, fallback) in zip(cols, FIELDS[kind], strict=True):
        default = PROBES[kind].Params.model_fields[name].default if fallback is None else fallback
        data[name] = col.number_input(
            label,
            value=default,
            key=f"probe_{kind}_{name}",
            min_value=0 if isinstance(default, int) else 0.0,
        )
    extra = st.text_area(
        "Other parameters (JSON)",
        "{}",
        key=f"probe_{kind}_extra",
        help='any other parameter of the probe, e.g. {"profile": "code-review", "seed": 3}',
    )
    if kind == "oom":
        st.warning(
            "The OOM probe grows the context until the engine queues, preempts, rejects "
            "or fails. It can crash the engine and disturbs every request it serves."
        )
        data["confirm"] = st.checkbox("I understand; run it", key="oom_confirm")
        if target is not None and not target.managed:
            data["allow_external"] = st.checkbox(
                f"{target.name} is not managed by kvscope: push it anyway", key="oom_external"
            )
    if st.button("Start", type="primary", key="probe_start"):
        try:
            data |= json.loads(extra or "{}")
            params = parse_params(kind, data, queries.stored_profiles(common.store()))
            if kind == "oom" and not target.managed and not data.get("allow_external"):
                raise InvalidInput(
                    "the OOM probe runs on a managed engine unless you allow an external one"
                )
        except json.JSONDecodeError as err:
            st.error(f"Other parameters are not JSON: {err}")
        except KvscopeError as err:
            st.error(str(err))
        else:
            run = queries.request_run(common.store(), kind, params.model_dump(), target.id)
            st.success(f"Queued run {run.id}; the worker starts it within a second.")


@st.fragment(run_every=1.0)
def _running() -> None:
    active = [
        r
        for r in queries.list_runs(common.store(), limit=50)
        if r.kind in PROBES and r.status in ("queued", "running")
    ]
    if not active:
        return
    st.subheader("Running")
    for run in active:
        partial = run.summary.get("partial", {})
        c1, c2 = st.columns([5, 1])
        c1.progress(
            run.progress,
            text=f"run {run.id} · {TITLES.get(run.kind, run.kind)} · "
            f"{run.status} · {partial.get('phase', '')}",
        )
        if c2.button("Cancel", key=f"cancel_{run.id}", disabled=run.cancel_requested):
            queries.cancel_run(common.store(), run.id)
        _partial_chart(run, partial)


def _partial_chart(run: RunRow, partial: dict[str, Any]) -> None:
    if run.kind == "batch_sweep" and partial.get("steps"):
        st.plotly_chart(charts.sweep_chart(partial["steps"], None), key=f"live_{run.id}")
    elif run.kind == "oom" and partial.get("steps"):
        st.plotly_chart(charts.oom_chart(partial["steps"], None, None), key=f"live_{run.id}")
    elif run.kind == "kv_usage" and partial.get("timeline"):
        st.plotly_chart(charts.kv_timeline_chart(partial["timeline"], None), key=f"live_{run.id}")
    elif run.kind == "capacity" and partial.get("steps"):
        share = float(run.params.get("share", 0.9))
        st.plotly_chart(charts.capacity_chart(partial["steps"], share), key=f"live_{run.id}")


def headline(run: RunRow) -> str:
    """One line saying what a finished run found."""
    s = run.summary
    if run.status == "failed":
        return run.error or "failed"
    if run.kind == "latency" and s.get("ttft_s"):
        return (
            f"{s.get('requests')} requests, TTFT p50 {_ms(s['ttft_s'].get('p50'))} p99 "
            f"{_ms(s['ttft_s'].get('p99'))}, ITL p50 {_ms(s['itl_s'].get('p50'))}"
            + ("" if s.get("trustworthy", True) else " (sender was late: not trusted)")
        )
    if run.kind == "batch_sweep" and s.get("knee"):
        return str(s["knee"].get("message", ""))
    return str(s.get("message") or run.error or "")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _history(runs: list[RunRow], names: dict[int, str]) -> None:
    st.subheader("History")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "run": r.id,
                    "probe": TITLES.get(r.kind, r.kind),
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
            f"{r.id} · {TITLES.get(r.kind, r.kind)} · "
            f"{names.get(r.target_id or -1, '?')} · {r.status}"
        ),
    )
    if run is None:
        return
    st.caption(headline(run))
    s = run.summary
    if run.kind == "latency":
        _latency_view(run)
    elif run.kind == "batch_sweep" and s.get("steps"):
        st.plotly_chart(charts.sweep_chart(s["steps"], s["knee"]["concurrency"]), key="res")
        st.dataframe(_steps_table(s["steps"]), hide_index=True)
    elif run.kind == "oom" and s.get("steps"):
        st.plotly_chart(
            charts.oom_chart(s["steps"], s.get("failure"), s.get("predicted")), key="res"
        )
        if s.get("predicted"):
            st.caption(f"Planner: {s['predicted']['why']}.")
        st.caption(f"Engine health afterwards: {s.get('health_after')}.")
        st.dataframe(pd.DataFrame(s["steps"]), hide_index=True)
    elif run.kind == "kv_usage" and s.get("timeline"):
        st.plotly_chart(charts.kv_timeline_chart(s["timeline"], s.get("load_window")), key="res")
    elif run.kind == "capacity" and s.get("steps"):
        st.plotly_chart(charts.capacity_chart(s["steps"], s["slo"]["share"]), key="res")
        st.dataframe(
            pd.DataFrame(s["steps"]).drop(columns=["ttft_s", "tpot_s"], errors="ignore"),
            hide_index=True,
        )


def _latency_view(run: RunRow) -> None:
    s = run.summary
    engine = s.get("engine", {})
    rows = []
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        row: dict[str, Any] = {"": label, "side": "client"}
        row |= {q: s.get(key, {}).get(q) for q in ("p50", "p95", "p99")}
        row["p99/p50"] = (s.get("p99_over_p50") or {}).get(key)
        rows.append(row)
        mine = engine.get(key.removesuffix("_s"))
        if mine:
            rows.append(
                {
                    "": label,
                    "side": "engine histogram",
                    **{q: mine.get(q) for q in ("p50", "p95", "p99")},
                }
            )
    if engine.get("queue_time"):
        rows.append(
            {
                "": "queue time",
                "side": "engine histogram",
                **{q: engine["queue_time"].get(q) for q in ("p50", "p95", "p99")},
            }
        )
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        column_config={
            q: st.column_config.NumberColumn(format="%.4f") for q in ("p50", "p95", "p99")
        },
    )
    st.caption(
        "Client times count from each request's scheduled send; the engine's come "
        "from vLLM's own histograms over the same requests (bucket-interpolated). "
        f"Send lateness p99 {_ms((s.get('lateness_s') or {}).get('p99'))}."
    )
    records = queries.run_records(common.store(), run.id)
    ok = records[records["status"] == "ok"]
    if not ok.empty:
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


def _steps_table(steps: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "concurrency": s["concurrency"],
                "requests/s": s["requests_per_s"],
                "output tokens/s": s["output_tokens_per_s"],
                "TTFT p50": s["ttft_s"]["p50"],
                "ITL p50": s["itl_s"]["p50"],
                "E2E p50": s["e2e_s"]["p50"],
                "E2E p99": s["e2e_s"]["p99"],
                "peak KV": s.get("kv_usage_peak"),
                "preemptions": s.get("preemptions"),
            }
            for s in steps
        ]
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
        st.dataframe(compare_table(a, b), hide_index=True)
        if a.kind == "latency":
            ra = queries.run_records(common.store(), a.id)
            rb = queries.run_records(common.store(), b.id)
            st.plotly_chart(
                charts.cdf_chart(
                    {
                        f"run {a.id} TTFT": ra["ttft_s"].dropna().tolist(),
                        f"run {b.id} TTFT": rb["ttft_s"].dropna().tolist(),
                    },
                    "TTFT CDF, both runs",
                ),
                key="cmp_cdf",
            )


def compare_table(a: RunRow, b: RunRow) -> pd.DataFrame:
    """Numbers of two runs side by side: every scalar and p50/p95/p99 of their summaries."""

    def flat(summary: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in summary.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = value
            elif isinstance(value, dict):
                for sub in ("p50", "p95", "p99", "concurrency", "context", "kind"):
                    if sub in value and not isinstance(value[sub], dict | list):
                        out[f"{key}.{sub}"] = value[sub]
        return out

    fa, fb = flat(a.summary), flat(b.summary)
    keys = [k for k in fa if k in fb]
    return pd.DataFrame(
        {"figure": keys, f"run {a.id}": [fa[k] for k in keys], f"run {b.id}": [fb[k] for k in keys]}
    )


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
                            "probe": TITLES.get(s.kind, s.kind),
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
                queries.remove_schedule(store, gone)
                st.rerun()
        with st.form("add_schedule"):
            kind = st.selectbox(
                "Probe", [k for k in PROBES if k != "oom"], format_func=lambda k: TITLES.get(k, k)
            )
            target = st.selectbox("Target", targets, format_func=lambda t: t.name)
            every = st.number_input("Every (minutes)", min_value=1.0, value=10.0)
            params = st.text_area("Parameters (JSON)", '{"rate": 1, "duration_s": 20}')
            if st.form_submit_button("Add schedule"):
                try:
                    data = json.loads(params or "{}")
                    parsed = parse_params(kind, data, queries.stored_profiles(store))
                    queries.add_schedule(store, target.id, kind, parsed.model_dump(), every * 60)
                except json.JSONDecodeError as err:
                    st.error(f"Parameters are not JSON: {err}")
                except KvscopeError as err:
                    st.error(str(err))
                else:
                    st.success(f"The worker runs it every {every:g} minutes.")
                    time.sleep(0.2)
                    st.rerun()
