"""What-if page: the tail a model on a GPU would show at each rate, before you have it.

Thin by design: widgets in, `planner.simulate` out (the same scenario `kvscope simulate`
builds), figures from app/charts/whatif.py. Every prediction says its source and what is
known of that source's error.
"""

from __future__ import annotations

import json
import time

import numpy as np
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app import common
from app.charts import whatif as charts
from planner.gpus import catalog, get_gpu
from planner.models import load_preset, preset_names
from planner.simulate import roofline
from planner.simulate.calibrate import CALIBRATION_KEY, Calibration, retune_hint
from planner.simulate.setup import VARIANTS, Settings, calibrated_scenario, scenario, variant
from planner.simulate.whatif import RatePoint, SloBounds, max_rate, sweep
from planner.workload import PRESETS

KEY = "whatif_"
NONE = "nothing"
SOURCE_NOTE = (
    f"Step cost: roofline ({roofline.describe()}). The scheduler itself is checked step by "
    "step (docs/simulator.md)."
)


ROOFLINE = "roofline (a model on a catalog GPU)"
CALIBRATED = "calibrated on {}"


@st.cache_data(ttl=10, show_spinner=False)
def _calibrations(url: str) -> dict[str, str]:
    """Stored calibrations by target name, as JSON."""
    from storage import queries as q

    found = q.states_under(common.store(), CALIBRATION_KEY.format(""))
    return {name: Calibration.model_validate(doc).model_dump_json() for name, doc in found.items()}


@st.cache_data(show_spinner=False, max_entries=32)
def _curve(
    model: str,
    gpu: str,
    calibration_json: str,
    settings_json: str,
    profile: str,
    slo: tuple[float, float, float],
    rates: tuple[float, ...],
    seeds: int,
    replicas: int,
) -> tuple[list[RatePoint], float | None, int]:
    """Points (rates as the whole traffic), the highest rate meeting the SLO, KV blocks; from
    a roofline of `model` on `gpu`, or from a stored calibration."""
    settings = Settings.model_validate_json(settings_json)
    bounds = SloBounds(ttft_s=slo[0], tpot_s=slo[1], share=slo[2])
    if calibration_json:
        calibration = Calibration.model_validate_json(calibration_json)
        what = calibrated_scenario(calibration, settings, profile, bounds)
    else:
        what, _ = scenario(load_preset(model), get_gpu(gpu), settings, profile, bounds)
    points = sweep(what, [r / replicas for r in rates], seeds)
    for i, p in enumerate(points):
        whole = p.prediction.model_copy(update={"rate": p.prediction.rate * replicas})
        points[i] = p.model_copy(update={"prediction": whole})
    best = max_rate(what)
    return points, None if best is None else best * replicas, what.config.num_blocks


def _profile(column: DeltaGenerator) -> str:
    choice = column.selectbox(
        "Traffic", list(PRESETS), index=list(PRESETS).index("chat"), key=KEY + "profile",
        help="The probes' workload profiles: the same lengths a latency probe would send.",
    )  # fmt: skip
    return str(choice)


def _calibrated_settings() -> tuple[Settings, str]:
    """What a calibrated engine lets change: its scheduling, and the traffic."""
    c = st.columns(3)
    profile = _profile(c[0])
    seqs = c[1].number_input(
        "max_num_seqs (0 = the engine's)", 0, 4096, 0, key=KEY + "cal_seqs",
        help="The calibrated engine's own limit when 0.",
    )  # fmt: skip
    threshold = c[2].number_input(
        "Long-prefill cap (0 = the engine's)", 0, 65536, 0, key=KEY + "cal_threshold",
        help="vLLM's --long-prefill-token-threshold.",
    )  # fmt: skip
    given: dict[str, object] = {}
    if seqs:
        given["max_num_seqs"] = int(seqs)
    if threshold:
        given["long_prefill_token_threshold"] = int(threshold)
    return Settings.model_validate(given), profile


def _settings() -> tuple[Settings, str, str, str]:
    names = list(preset_names())
    top = st.columns(3)
    model = top[0].selectbox(
        "Model", names, index=names.index("llama-3.1-8b"), key=KEY + "model",
        help="A built-in preset (its published config.json).",
    )  # fmt: skip
    gpus = {g.name: g.key for g in catalog() if g.bandwidth_gbs and g.bf16_tflops}
    gpu_name = top[1].selectbox(
        "GPU", list(gpus), index=list(gpus.values()).index("h100-sxm"), key=KEY + "gpu",
        help="Catalog GPUs with bandwidth and peak figures (the roofline needs both).",
    )  # fmt: skip
    profile = _profile(top[2])
    c = st.columns(4)
    tp = c[0].number_input("Tensor parallel", 1, 8, 1, key=KEY + "tp")
    kv = c[1].selectbox("KV dtype", ["auto", "fp8"], key=KEY + "kv")
    seqs = c[2].number_input(
        "max_num_seqs (0 = vLLM's)", 0, 4096, 0, key=KEY + "seqs",
        help="vLLM's default for the GPU when 0.",
    )  # fmt: skip
    max_len = c[3].number_input(
        "max_model_len", 256, 131072, 8192, step=1024, key=KEY + "max_len",
        help="Longest request the engine accepts; the KV cache must hold one.",
    )  # fmt: skip
    c = st.columns(4)
    chunked = c[0].checkbox("Chunked prefill", True, key=KEY + "chunked")
    threshold = c[1].number_input(
        "Long-prefill cap (0 = none)", 0, 65536, 0, key=KEY + "threshold",
        help="vLLM's --long-prefill-token-threshold: most prompt tokens one request takes a step.",
    )  # fmt: skip
    arrival = c[2].selectbox("Arrivals", ["poisson", "gamma"], key=KEY + "arrival")
    cv = c[3].number_input(
        "Burstiness (CV)", 0.1, 10.0, 3.0 if arrival == "gamma" else 1.0, key=KEY + "cv",
        disabled=arrival != "gamma", help="Coefficient of variation of the gaps (1: Poisson).",
    )  # fmt: skip
    settings = Settings(
        kv_cache_dtype=kv,
        max_num_seqs=int(seqs) or None,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=int(threshold),
        max_model_len=int(max_len),
        tensor_parallel_size=int(tp),
        arrival=arrival,
        cv=float(cv) if arrival == "gamma" else 1.0,
    )
    return settings, model, gpus[gpu_name], profile


def render() -> None:
    st.title("What-if")
    st.caption(
        "vLLM V1's scheduler in simulated time (token budget, max_num_seqs, paged KV blocks "
        "counted by the planner, preemption by recompute): predicted TTFT, TPOT and E2E at "
        "each rate, for hardware you do not have yet."
    )
    calibrations = _calibrations(common.db_url())
    sources = [ROOFLINE, *(CALIBRATED.format(name) for name in calibrations)]
    source = st.selectbox(
        "Step cost", sources, key=KEY + "source",
        help="A roofline from datasheet figures, or a step cost fitted to an engine kvscope "
        "measured (kvscope simulate calibrate --target NAME).",
    )  # fmt: skip
    calibration = target = ""
    variants = list(VARIANTS)
    if source == ROOFLINE:
        settings, model, gpu, profile = _settings()
    else:
        target = list(calibrations)[sources.index(source) - 1]
        calibration = calibrations[target]
        settings, profile = _calibrated_settings()
        model, gpu = "", ""
        variants = [v for v in variants if v != "FP8 KV cache"]  # the cost was measured
    c = st.columns(4)
    ttft = c[0].number_input("SLO: TTFT bound (s)", 0.01, 60.0, 0.5, key=KEY + "ttft")
    tpot = c[1].number_input("SLO: TPOT bound (s)", 0.001, 5.0, 0.05, key=KEY + "tpot")
    share = c[2].number_input("SLO: share inside", 0.5, 1.0, 0.99, key=KEY + "share")
    other = c[3].selectbox(
        "Beside it", [NONE, *variants], key=KEY + "variant",
        help="A second setting, simulated on the same traffic.",
    )  # fmt: skip
    c = st.columns(4)
    low = c[0].number_input("Lowest rate (req/s)", 0.1, 10000.0, 1.0, key=KEY + "low")
    high = c[1].number_input("Highest rate (req/s)", 0.2, 10000.0, 20.0, key=KEY + "high")
    count = c[2].number_input("Rates", 2, 20, 6, key=KEY + "count")
    requests = c[3].number_input(
        "Requests per run", 100, 20000, 600, step=100, key=KEY + "requests",
        help="More requests steady the tail; a run past the capacity only grows its queue.",
    )  # fmt: skip
    seeds = st.slider(
        "Seeds per rate", 1, 20, 1, key=KEY + "seeds",
        help="9 or more give an 80 % band on p99 (more time).",
    )  # fmt: skip
    if high <= low:
        st.error("The highest rate must be above the lowest.")
        return
    settings = settings.model_copy(update={"num_requests": int(requests)})
    rates = tuple(float(r) for r in np.linspace(low, high, int(count)))
    slo = (float(ttft), float(tpot), float(share))
    arms = {"as set": (settings, 1)}
    if other != NONE:
        arms[other] = variant(settings, other)
    curves, best, blocks = {}, {}, {}
    with st.spinner("Simulating…"):
        for label, (s, replicas) in arms.items():
            curves[label], best[label], blocks[label] = _curve(
                model, gpu, calibration, s.model_dump_json(exclude_unset=True), profile, slo,
                rates, int(seeds), replicas,
            )  # fmt: skip
    cols = st.columns(len(arms))
    for col, label in zip(cols, arms, strict=True):
        rate = best[label]
        col.metric(
            f"Highest rate meeting the SLO ({label})",
            "none" if rate is None else f"{rate:,.2f} req/s",
            help=f"{share:.0%} of requests within TTFT {ttft:g} s and TPOT {tpot:g} s; "
            f"{blocks[label]:,} KV blocks per replica (from the planner).",
        )
    st.plotly_chart(charts.tail_figure(curves, float(ttft)), key=KEY + "chart_tail")
    flags = sorted({f for pts in curves.values() for p in pts for f in p.prediction.extrapolation})
    for f in flags:
        st.warning(f"Extrapolation: {f}")
    shown = {label: _nearest(pts, best[label]).prediction for label, pts in curves.items()}
    st.plotly_chart(charts.kv_figure(shown), key=KEY + "chart_kv")
    st.caption(
        "KV usage over the run nearest the highest rate meeting the SLO: "
        + "; ".join(
            f"{k} at {p.rate:,.2f} req/s, {p.preemptions} preemptions" for k, p in shown.items()
        )
    )
    st.dataframe(
        [
            {
                "setting": label,
                "rate": p.prediction.rate,
                "TTFT p50 (ms)": _ms(p.prediction.ttft_s.p50),
                "TTFT p99 (ms)": _ms(p.prediction.ttft_s.p99),
                "TPOT p99 (ms)": _ms(p.prediction.tpot_s.p99),
                "E2E p99 (s)": p.prediction.e2e_s.p99,
                "SLO share": p.prediction.slo_share,
                "preemptions": p.prediction.preemptions,
                "prefix cache hits": p.prediction.prefix_hit_rate,
                "utilisation": p.prediction.utilisation,
            }
            for label, pts in curves.items()
            for p in pts
        ],
        hide_index=True,
    )
    if calibration:
        cal, now = Calibration.model_validate_json(calibration), time.time()
        st.caption(f"Step cost: {cal.describe(now)}. Past those, a prediction is an extrapolation.")
        if hint := retune_hint(cal, now):
            st.info(hint[0].upper() + hint[1:] + ".")
        if cal.checks:
            with st.expander(f"Later runs checked against it ({len(cal.checks)})"):
                st.caption(
                    "Each run's requests replayed at the calibrated step cost: how many "
                    "times as long its steps took, and the host's stalls it met (the p99 "
                    "of what that replay leaves of each TTFT; kept for the newest runs "
                    "that did not queue). From three since the tune on, a prediction takes "
                    "the step cost at their geometric mean, and the p99 interval draws its "
                    "drift around it and its host noise from these. Runs that queued ran "
                    "full batches: where they drift apart from the others, the full batch's "
                    "cost is off."
                )
                st.dataframe(
                    [
                        {
                            "checked": time.strftime("%Y-%m-%d %H:%M", time.localtime(c.at)),
                            "run": c.run,
                            "steps x": round(c.drift, 3),
                            "queued": None if c.queued is None else ("yes" if c.queued else "no"),
                            "stalls, TTFT p99 (ms)": None
                            if (p99 := c.ttft_noise_p99_s) is None
                            else round(p99 * 1000, 1),
                        }
                        for c in reversed(cal.checks)
                    ],
                    hide_index=True,
                )
    else:
        st.caption(SOURCE_NOTE)
    with st.expander("The same from a shell"):
        sets = " ".join(
            f"--set {k}={json.dumps(v) if isinstance(v, str) else v}"
            for k, v in settings.model_dump(exclude_unset=True, exclude_defaults=True).items()
        )
        st.code(
            "kvscope simulate "
            + (f"--target {target} " if target else f"-m {model} -g {gpu} ")
            + f"--profile {profile} --sweep-rate "
            f"{low:g}:{high:g}:{int(count)} --slo-ttft {ttft:g} --slo-tpot {tpot:g} "
            f"--slo-share {share:g} --seeds {int(seeds)} {sets} --json",
            language="bash",
        )


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 1)


def _nearest(points: list[RatePoint], rate: float | None) -> RatePoint:
    """The point nearest `rate` (the highest rate meeting the SLO), else the last."""
    if rate is None:
        return points[-1]
    return min(points, key=lambda p: abs(p.prediction.rate - rate))
