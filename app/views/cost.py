"""Cost page: the price of headroom against the price of breaking the promise; the
degradation ladder; and the queueing view, a thinking tool beside measured waits."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import common
from app.charts.cost import cost_chart
from planner.capacity import PlanRequest
from planner.cost import (
    CostInputs,
    Degradation,
    ShareTable,
    cold_start_cost,
    cost_frame,
    deferred_queue,
    fewer_chunks,
    ladder,
    no_reasoning,
    share_outside_from_measurements,
    share_outside_from_queueing,
    shorter_answers,
    smaller_model,
)
from planner.errors import KvscopeError
from planner.gpus import get_gpu, gpu_names
from planner.models import load_preset, preset_names
from planner.queueing import queue_estimate
from planner.simulate.setup import Settings, scenario
from planner.simulate.whatif import SloBounds, capacity_rps, predict
from planner.workload import PRESETS
from storage import queries
from storage.access import changes
from storage.dashboards import measured_cold_starts, measured_points, queue_inputs


def render() -> None:
    """Draw the page."""
    st.title("Cost of reserve against cost of violations")
    inputs = _inputs()
    shares = _shares(inputs)
    if inputs is not None and shares is not None:
        try:
            frame = cost_frame(inputs["costs"], shares)
        except KvscopeError as err:
            st.error(str(err))
        else:
            st.plotly_chart(cost_chart(frame), key="cost")
            st.dataframe(
                pd.DataFrame(
                    [
                        {
                            "reserve": r.reserve,
                            "reserve GPUs": r.reserve_gpus,
                            "share outside SLO": r.share_outside,
                            "violations": r.violations,
                            "cost of reserve": r.cost_of_reserve,
                            "cost of violations": r.cost_of_violation,
                            "total": r.total,
                            "cheapest": "★" if r.is_minimum else "",
                        }
                        for r in frame.rows
                    ]
                ),
                hide_index=True,
                column_config={
                    "share outside SLO": st.column_config.NumberColumn(format="percent"),
                    "violations": st.column_config.NumberColumn(format="%.0f"),
                    "cost of reserve": st.column_config.NumberColumn(format="dollar"),
                    "cost of violations": st.column_config.NumberColumn(format="dollar"),
                    "total": st.column_config.NumberColumn(format="dollar"),
                },
            )
            st.caption(
                "Cost of reserve = price per GPU-hour x reserve GPUs x hours. Cost of "
                "violations = share of requests outside the SLO x requests x cost per "
                f"violation. Shares: {frame.source}. " + " ".join(frame.notes)
            )
    if inputs is not None:
        _cold_start(inputs)
        common.retry_panel(0.2, inputs["base"], key="cost")
    st.divider()
    steps = _ladder()
    if st.button("Record this frame", key="cost_record") and inputs is not None:
        name = st.session_state.get("cost_name") or "default"
        try:
            changes.save_cost_frame(common.store(), common.actor(), name, inputs["raw"], steps)
        except KvscopeError as err:
            st.error(str(err))
        else:
            st.success(f"Recorded as {name!r}.")
    st.text_input("Frame name", "default", key="cost_name")
    recorded = queries.cost_frames(common.store())
    if recorded:
        with st.expander(f"Recorded frames ({len(recorded)})"):
            for name, (raw, steps_rec) in recorded.items():
                st.markdown(f"**{name}**: {raw}")
                if steps_rec:
                    st.dataframe(pd.DataFrame(steps_rec), hide_index=True)
    st.divider()
    _queueing()


def _inputs() -> dict[str, Any] | None:
    st.subheader("Prices and traffic")
    c = st.columns(3)
    price = c[0].number_input("Price per GPU-hour ($)", min_value=0.0, value=2.5)
    gpus = c[1].number_input("GPUs per replica", min_value=1, value=1)
    base = c[2].number_input("Replicas the base load needs", min_value=1, value=2)
    d = st.columns(3)
    hours = d[0].number_input("Hours", min_value=1.0, value=730.0, help="a month is ~730 h")
    traffic = d[1].number_input("Requests per hour", min_value=0.0, value=36000.0)
    per_violation = d[2].number_input(
        "Cost per violation ($)",
        min_value=0.0,
        value=0.02,
        format="%.4f",
        help="what one request outside the SLO costs: refunds, churn, a retry's compute",
    )
    raw = {
        "price_per_gpu_hour": price,
        "gpus_per_replica": int(gpus),
        "base_replicas": int(base),
        "hours": hours,
        "requests_per_hour": traffic,
        "cost_per_violation": per_violation,
    }
    try:
        costs = CostInputs(price, int(gpus), hours, traffic, per_violation)
    except KvscopeError as err:
        st.error(str(err))
        return None
    return {"costs": costs, "raw": raw, "base": int(base)}


def _shares(inputs: dict[str, Any] | None) -> ShareTable | None:
    if inputs is None:
        return None
    st.subheader("Share of requests outside the SLO at each reserve level")
    targets = common.targets(common.db_url())
    reserves = tuple(range(0, int(st.number_input("Reserve levels to weigh", 1, 20, 5)) + 1))
    rate = inputs["costs"].requests_per_hour / 3600
    points = []
    target = None
    if targets:
        target = st.selectbox(
            "Measured on", targets, format_func=lambda t: t.name, key="cost_target"
        )
        points = measured_points(common.store(), target.id) if target else []
    try:
        if points:
            st.caption(
                f"From {len(points)} measurement(s) of {target.name if target else '?'}: "
                "latency and capacity probe runs that judged an SLO."
            )
            return share_outside_from_measurements(
                [(p.rate, p.share_outside) for p in points],
                rate,
                inputs["base"],
                reserves,
                source=f"measured on {target.name if target else '?'}",
            )
        st.caption(
            "No measurement yet (run a capacity probe, or latency probes with an SLO "
            "at several rates): a model stands in, labelled as such."
        )
        stand_in = st.radio(
            "Shares from", [QUEUEING, SIMULATOR], horizontal=True, key="cost_stand_in",
            help="The simulator runs vLLM's scheduler at each reserve level's load per replica.",
        )  # fmt: skip
        if stand_in == SIMULATOR:
            return _simulated_shares(rate, inputs["base"], reserves)
        c = st.columns(4)
        per_replica = c[0].number_input(
            "Requests/s one replica completes",
            min_value=0.01,
            value=max(rate / max(inputs["base"], 1) * 1.2, 0.01),
        )
        budget = c[1].number_input("Wait a request can absorb (s)", min_value=0.0, value=0.5)
        ca = c[2].number_input("Arrival CV", min_value=0.0, value=1.0)
        cs = c[3].number_input("Service CV", min_value=0.0, value=1.0)
        return share_outside_from_queueing(
            rate, per_replica, inputs["base"], budget, reserves, ca=ca, cs=cs
        )
    except KvscopeError as err:
        st.error(str(err))
        return None


QUEUEING = "queueing model"
SIMULATOR = "simulator"


@st.cache_data(show_spinner=False, max_entries=16)
def _simulated_outside(
    model: str, gpu: str, profile: str, slo: tuple[float, float], rates: tuple[float, ...]
) -> tuple[list[float], str]:
    """Share of requests outside the SLO at each rate per replica, simulated; the source."""
    bounds = SloBounds(ttft_s=slo[0], tpot_s=slo[1])
    settings = Settings(num_requests=600)
    what, _ = scenario(load_preset(model), get_gpu(gpu), settings, profile, bounds)
    capacity = capacity_rps(what)
    shares = []
    for r in rates:
        inside = predict(what, r, capacity=capacity).slo_share
        shares.append(1.0 - (inside or 0.0))
    return shares, f"simulated ({what.source}, uncalibrated) for {model} on {gpu}"


def _simulated_shares(rate: float, base: int, reserves: tuple[int, ...]) -> ShareTable:
    presets, gpus = preset_names(), gpu_names()
    c = st.columns(5)
    model = c[0].selectbox(
        "Model", presets, index=presets.index("llama-3.1-8b"), key="cost_sim_model"
    )
    gpu = c[1].selectbox("GPU", gpus, index=gpus.index("h100-sxm"), key="cost_sim_gpu")
    profile = c[2].selectbox("Traffic", list(PRESETS), key="cost_sim_profile")
    ttft = c[3].number_input("TTFT bound (s)", 0.01, 60.0, 0.5, key="cost_sim_ttft")
    tpot = c[4].number_input("TPOT bound (s)", 0.001, 5.0, 0.05, key="cost_sim_tpot")
    loads = tuple(sorted({rate / (base + r) for r in reserves}))
    with st.spinner("Simulating each reserve level…"):
        shares, source = _simulated_outside(model, gpu, profile, (float(ttft), float(tpot)), loads)
    st.caption(f"Shares {source}: a prediction, not a measurement (see the What-if page).")
    return share_outside_from_measurements(
        list(zip(loads, shares, strict=True)), rate, base, reserves, source=source
    )


def _ladder() -> list[dict[str, Any]]:
    st.subheader("Degradation ladder")
    st.caption(
        "Cheaper ways to answer when capacity runs short, each step on top of the ones "
        "above it; the capacity it frees comes from the KV planner."
    )
    presets, gpus = preset_names(), gpu_names()
    c = st.columns(4)
    model = c[0].selectbox(
        "Model", presets, index=presets.index("llama-3.1-8b") if "llama-3.1-8b" in presets else 0
    )
    gpu = c[1].selectbox("GPU", gpus, index=gpus.index("h100-sxm") if "h100-sxm" in gpus else 0)
    prompt = c[2].number_input("Prompt tokens", min_value=1, value=2000)
    output = c[3].number_input("Output tokens", min_value=1, value=800)
    steps: list[Degradation] = []
    d = st.columns(5)
    if d[0].checkbox("Shorter answers", True):
        steps.append(shorter_answers(d[0].slider("to", 0.1, 1.0, 0.6)))
    if d[1].checkbox("No reasoning", False):
        steps.append(no_reasoning(int(d[1].number_input("tokens", 0, 100_000, 300))))
    if d[2].checkbox("Fewer retrieved chunks", True):
        steps.append(
            fewer_chunks(
                int(d[2].number_input("chunks", 0, 100, 2)),
                int(d[2].number_input("tokens each", 0, 10_000, 300)),
            )
        )
    if d[3].checkbox("Smaller model", False):
        small = d[3].selectbox("model", presets, key="ladder_small")
        steps.append(smaller_model(load_preset(small)))
    if d[4].checkbox("Deferred queue", True):
        steps.append(deferred_queue(d[4].slider("share to batch", 0.0, 0.9, 0.2)))
    try:
        rows = ladder(
            PlanRequest(model=load_preset(model), gpu=get_gpu(gpu)),
            steps,
            prompt_tokens=int(prompt),
            output_tokens=int(output),
        )
    except KvscopeError as err:
        st.error(str(err))
        return []
    table = [
        {
            "step": r.name,
            "sequences before": r.concurrency_before,
            "sequences after": r.concurrency_after,
            "frees": r.freed_share,
            "frees in all": r.freed_total,
            "how": r.how,
        }
        for r in rows
    ]
    st.dataframe(
        pd.DataFrame(table),
        hide_index=True,
        column_config={
            "frees": st.column_config.NumberColumn(format="percent"),
            "frees in all": st.column_config.NumberColumn(format="percent"),
        },
    )
    return table


def _queueing() -> None:
    st.subheader("Queueing view")
    runs = [
        r for r in queries.list_runs(common.store(), kind="latency", limit=50) if r.status == "done"
    ]
    if not runs:
        st.info(
            "Run a latency probe: its arrivals and service times feed Kingman's "
            "approximation here, beside the waits it measured."
        )
        return
    run = st.selectbox(
        "Latency run",
        runs,
        format_func=lambda r: (
            f"run {r.id}: {r.params.get('rate')} req/s for {r.params.get('duration_s')} s"
        ),
    )
    try:
        m = queue_inputs(common.store(), run.id)
    except KvscopeError as err:
        st.error(str(err))
        return
    servers = st.number_input("Servers (sequences the engine runs at once)", min_value=1, value=1)
    c = st.columns(4)
    c[0].metric("Arrival rate", f"{m.rate:.2f}/s")
    c[1].metric("Arrival CV", f"{m.ca:.2f}")
    c[2].metric("Mean service", f"{m.service_s:.3f} s", help=m.service_note)
    c[3].metric("Service CV", f"{m.cs:.2f}")
    try:
        est = queue_estimate(m.rate, m.service_s, int(servers), m.ca, m.cs)
    except KvscopeError as err:
        st.warning(str(err))
        return
    d = st.columns(3)
    d[0].metric(
        f"Predicted mean wait ({est.model})",
        f"{est.mean_wait_s * 1000:.1f} ms",
        help=f"utilisation {est.rho:.0%}",
    )
    d[1].metric(
        "Engine mean queue time (measured)",
        "-" if m.engine_queue_mean_s is None else f"{m.engine_queue_mean_s * 1000:.1f} ms",
        help="vLLM's request_queue_time histogram over the run, its sum over its count: "
        "a mean, like the prediction"
        + (
            ""
            if m.engine_queue_p50_s is None
            else f" (its median: {m.engine_queue_p50_s * 1000:.1f} ms)"
        ),
    )
    d[2].metric(
        "Client TTFT p50 (measured)",
        "-" if m.client_ttft_p50_s is None else f"{m.client_ttft_p50_s * 1000:.1f} ms",
    )
    strained = []
    if est.rho < 0.5:
        strained.append(
            f"at {est.rho:.0%} utilisation Kingman's heavy-traffic formula is loose "
            "(it is built for a busy server)"
        )
    if est.rho > 0.9:
        strained.append(
            f"at {est.rho:.0%} utilisation the wait swings with every small change of rate "
            "or service time"
        )
    if m.ca > 1.2:
        strained.append(f"arrivals are bursty (CV {m.ca:.2f}): waits come in waves")
    for line in strained:
        st.warning(f"Where the model strains: {line}.")
    st.caption(f"A thinking tool, not a forecast. {est.limits}")


def _cold_start(inputs: dict[str, Any]) -> None:
    st.subheader("Why the reserve must already be running")
    measured = measured_cold_starts(common.store())
    c = st.columns(2)
    if measured:
        name, took = max(measured.items(), key=lambda kv: kv[1])
        default, where = took, f"measured: engine {name}'s last start took {took:g} s"
    else:
        default, where = 120.0, "no managed engine has started yet: an estimate"
    cold = c[0].number_input("Cold start, start to healthy (s)", 0.0, value=default, help=where)
    surges = c[1].number_input("Surges per hour that need one more replica", 0.0, value=1.0)
    try:
        frame = cold_start_cost(inputs["costs"], inputs["base"], cold, surges)
    except KvscopeError as err:
        st.error(str(err))
        return
    st.markdown(
        f"Started when a surge comes, a replica serves nobody for {frame.cold_start_s:g} s "
        f"({where}): about {frame.violations_per_surge:,.0f} requests a surge wait or miss "
        f"the SLO, {frame.violations:,.0f} over the period, **${frame.cost_on_demand:,.2f}**. "
        f"One replica kept in reserve costs **${frame.cost_one_reserve:,.2f}**."
    )
    st.caption(
        "A rough model: the load one replica takes goes unserved for the whole cold start; "
        "a bigger surge, or a longer start (a larger model, a cold cache), costs more."
    )
