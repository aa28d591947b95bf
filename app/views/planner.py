"""Planner page: what fits on which GPU, and why, for any model vLLM can serve.

Thin by design: read widgets, call planner functions, render app/charts/planner.py figures.
Every number carries a one-line explanation (help= or a caption). Errors a user can fix
arrive as KvscopeError: the console's error boundary (app/common.py) shows them, and the
page catches one itself only where the sections above it stay worth seeing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import streamlit as st

from app import common
from app.charts import planner as charts
from planner.capacity import (
    BLOCK_SIZES,
    CapacityPlan,
    PlanRequest,
    concurrency_at,
    fits_map,
    plan_capacity,
    plans_by_kv_dtype,
    smallest_deployment,
    valid_tp_sizes,
)
from planner.errors import KvscopeError
from planner.fragmentation import LengthDistribution, fragmentation, output_lengths
from planner.gpus import GIB, GPUSpec, catalog, custom_gpu, get_gpu
from planner.kv import default_block_size, kv_bytes_per_token, kv_dtype_choices, vllm_kv_cache
from planner.measured import LogStudy, study_log
from planner.models import (
    WEIGHT_DTYPES,
    ModelArch,
    attention_variants,
    load_preset,
    parse_config_json,
    preset_names,
)
from probes.vllm.logparse import read_startup

UPLOAD = "Upload a config.json…"
CUSTOM = "Custom (memory in GiB)"
KEY = "planner_"
# The four KV dtypes the curves and frontiers compare.
CURVE_KV = ("auto", "fp8", "int8", "int4")


# Releases whose accounting the page offers; the first is the newest known.
RELEASES = ("newest (0.20+)", "0.19", "0.17", "0.16", "0.11", "0.10")


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


def _pick_model() -> ModelArch | None:
    names = [*preset_names(), UPLOAD]
    choice = st.selectbox(
        "Model",
        names,
        index=names.index("llama-3.1-8b"),
        key=KEY + "model",
        help="A built-in preset (its published Hugging Face config.json) or your own file.",
    )
    if choice != UPLOAD:
        return load_preset(choice)
    uploaded = st.file_uploader("config.json", type=["json"], key=KEY + "upload")
    if uploaded is None:
        st.info("Upload the model's config.json (from its Hugging Face repository).")
        return None
    return parse_config_json(uploaded.getvalue(), name=uploaded.name.removesuffix(".json"))


def _pick_gpu(prefix: str = "") -> GPUSpec:
    gpus = {g.name: g.key for g in catalog()}
    options = [*gpus, CUSTOM]
    choice = st.selectbox(
        "GPU",
        options,
        index=list(gpus.values()).index("h100-sxm"),
        key=KEY + prefix + "gpu",
        help="Catalog figures are datasheet values; memory is what the driver reports.",
    )
    if choice == CUSTOM:
        size = st.number_input(
            "GPU memory (GiB)",
            1.0,
            1024.0,
            80.0,
            key=KEY + prefix + "custom_gib",
            help="Total memory the driver reports (nvidia-smi's total).",
        )
        return custom_gpu(float(size))
    return get_gpu(gpus[choice])


def _request(arch: ModelArch) -> PlanRequest:
    # Widgets whose choices or defaults depend on the model are keyed per model, so that
    # switching to an MLA model offers its dtypes and its 64-token blocks.
    scope = "_" + arch.name
    gpu = _pick_gpu()
    cols = st.columns(3)
    num_gpus = cols[0].number_input(
        "GPUs",
        1,
        512,
        1,
        key=KEY + "num_gpus",
        help="GPUs in all: replicas x tensor parallel x pipeline parallel.",
    )
    tp = cols[1].number_input(
        "Tensor parallel (0 = GPUs / PP)",
        0,
        512,
        0,
        key=KEY + "tp",
        help="Valid sizes for this model: " + ", ".join(map(str, valid_tp_sizes(arch, 64))),
    )
    pp = cols[2].number_input(
        "Pipeline parallel",
        1,
        128,
        1,
        key=KEY + "pp",
        help="Pipeline stages; layers are split as vLLM splits them.",
    )
    cols = st.columns(3)
    weights = cols[0].selectbox(
        "Weights dtype",
        WEIGHT_DTYPES,
        key=KEY + "weights",
        help="auto: the checkpoint's quantization, else the served dtype. int4 assumes "
        "group-128 fp16 scales.",
    )
    model_dtype = cols[1].selectbox(
        "Model dtype (--dtype)",
        ["auto", "bfloat16", "float16", "float32"],
        key=KEY + "dtype",
        help="auto serves float32 checkpoints in bfloat16, as vLLM does.",
    )
    kv = cols[2].selectbox(
        "KV cache dtype",
        kv_dtype_choices(arch),
        key=KEY + "kv" + scope,
        help="auto follows the model dtype; fp8 halves the cache; int8/int4 add "
        "per-token-head fp32 scales.",
    )
    cols = st.columns(3)
    util = cols[0].slider(
        "gpu_memory_utilization",
        0.5,
        1.0,
        0.9,
        0.01,
        key=KEY + "util",
        help="Share of GPU memory vLLM may take for weights, activations and KV.",
    )
    kv_gib = cols[1].number_input(
        "Explicit KV size (GiB, 0 = off)",
        0.0,
        4096.0,
        0.0,
        key=KEY + "kv_gib",
        help="kv_cache_memory_bytes (or VLLM_CPU_KVCACHE_SPACE): replaces the budget.",
    )
    default_bs = default_block_size(arch)
    block = cols[2].selectbox(
        "Block size",
        BLOCK_SIZES,
        index=BLOCK_SIZES.index(default_bs),
        key=KEY + "block" + scope,
        help="Tokens per KV block (vLLM default 16; FlashMLA needs 64).",
    )
    cols = st.columns(3)
    limit = arch.max_position_embeddings
    max_len = cols[0].number_input(
        "Max model length",
        1,
        limit,
        limit,
        key=KEY + "max_len" + scope,
        help="--max-model-len; vLLM refuses to start if one such request cannot fit.",
    )
    context = cols[1].number_input(
        "Context per sequence",
        1,
        10_000_000,
        min(8192, int(max_len)),
        key=KEY + "context" + scope,
        help="Prompt plus output tokens of one sequence.",
    )
    batch = cols[2].number_input(
        "Batch (sequences at once)",
        1,
        100_000,
        16,
        key=KEY + "batch",
        help="Concurrent sequences to test.",
    )
    release = st.selectbox(
        "vLLM release (memory accounting)",
        RELEASES,
        key=KEY + "release",
        help="Which release's accounting of activation, non-torch and CUDA graph memory. "
        "Releases without published logs to check against give a range.",
    )
    return PlanRequest(
        model=arch,
        gpu=gpu,
        num_gpus=int(num_gpus),
        tp=int(tp) or None,
        pp=int(pp),
        weights_dtype=str(weights),
        model_dtype=str(model_dtype),
        kv_dtype=str(kv),
        gpu_memory_utilization=float(util),
        kv_cache_memory_bytes=round(float(kv_gib) * GIB) if kv_gib else None,
        block_size=int(block),
        max_model_len=int(max_len),
        context=int(context),
        batch=int(batch),
        vllm_version=None if release == RELEASES[0] else str(release),
    )


def _metrics(plan: CapacityPlan) -> None:
    m = plan.memory
    row = st.columns(4)
    row[0].metric(
        "Parameters",
        f"{plan.params / 1e9:,.2f} B",
        help="Counted from the config: embeddings, attention, MLP/experts, norms.",
    )
    row[1].metric(
        "Weights per GPU",
        _gib(plan.weights_bytes_per_gpu),
        help=f"{plan.weights_dtype} weights; TP splits them, PP gives each stage its layers.",
    )
    row[2].metric(
        "KV budget per GPU",
        _gib(m.kv_cache_bytes),
        help="Explicit size"
        if m.explicit_kv
        else f"{m.utilization:g} x {_gib(m.total_bytes)} minus weights, activation peak, "
        "non-torch memory and CUDA graphs.",
    )
    row[3].metric(
        "KV bytes per token",
        f"{plan.kv_bytes_per_token:,}",
        help="2 x layers x KV heads x head_dim x dtype bytes (MLA: layers x "
        "latent x bytes), whole model.",
    )
    row = st.columns(4)
    low, high = plan.kv_capacity_range
    row[0].metric(
        "KV capacity (tokens)" if low == high else "KV capacity (tokens, low end)",
        f"{low:,}",
        delta=None if low == high else f"up to {high:,} (unsure)",
        delta_color="off",
        help="num_blocks // KV cache groups x block size: vLLM's 'GPU KV cache size'. "
        "When the planner is unsure it plans the low end, which vLLM reaches.",
    )
    row[1].metric(
        "Blocks per GPU",
        f"{plan.num_blocks:,}",
        help="KV budget // page bytes // layers per group (vLLM's get_num_blocks).",
    )
    row[2].metric(
        f"Max concurrency at {plan.context:,}",
        f"{plan.max_concurrency:.2f}x",
        help="num_blocks / blocks for one request, as vLLM logs it.",
    )
    row[3].metric(
        f"Batch of {plan.request.batch}",
        "fits" if plan.fits else "OOM",
        delta=f"{plan.max_sequences:,} sequences fit",
        delta_color="off",
        help="Blocks less vLLM's null block, divided by blocks per sequence.",
    )
    if plan.accounting is not None:
        st.caption(
            f"Memory accounting: {plan.accounting.label}; batch limits "
            f"{plan.max_num_batched_tokens:,} tokens / {plan.max_num_seqs:,} sequences."
        )
    for note in plan.notes:
        st.warning(note)


def _curves(req: PlanRequest, plan: CapacityPlan) -> None:
    plans = plans_by_kv_dtype(req, CURVE_KV)
    start = plan.block_size
    contexts = np.unique(np.geomspace(start, plan.max_model_len, 64).astype(np.int64))
    st.plotly_chart(
        charts.concurrency_figure(
            contexts,
            {kv: concurrency_at(p, contexts) for kv, p in plans.items()},
            marker=(plan.context, plan.max_concurrency),
        ),
        key=KEY + "curve",
    )
    st.caption(
        "For each KV dtype: blocks on one GPU divided by the blocks one request of that "
        "length reserves (vLLM's 'Maximum concurrency'). Log scales."
    )
    batches = np.unique(np.geomspace(1, max(plan.max_sequences, 64) * 2, 64).astype(np.int64))
    grid_ctx = np.linspace(plan.block_size, plan.max_model_len, 64).astype(np.int64)
    grid = fits_map(plan, grid_ctx, batches)
    frontiers = {kv: fits_map(p, grid_ctx, batches).frontier for kv, p in plans.items()}
    st.plotly_chart(
        charts.fits_map_figure(grid.contexts, grid.batches, grid.fits, frontiers),
        key=KEY + "fits",
    )
    st.caption(
        f"Green: the batch of sequences of that context fits in the {plan.kv_dtype} cache; "
        "red: it does not. Lines: the longest context per batch (OOM frontier) per KV dtype."
    )


def _attention(req: PlanRequest, plan: CapacityPlan) -> None:
    budget = max(plan.memory.kv_cache_bytes, 0)
    labels, per_token, tokens = [], [], []
    for label, variant in attention_variants(req.model).items():
        layout = vllm_kv_cache(
            variant,
            budget,
            None,
            "auto",
            req.model_dtype,
            plan.tp,
            plan.max_model_len,
            plan.max_num_batched_tokens,
        )
        labels.append(label)
        per_token.append(kv_bytes_per_token(variant, layout.kv_dtype))
        tokens.append(max(layout.capacity_tokens, 1))
    st.plotly_chart(charts.attention_figure(labels, per_token, tokens), key=KEY + "attn")
    st.caption(
        f"Same layers and head size as {req.model.name}, same {_gib(budget)} KV budget per "
        "GPU: only how keys and values are shared changes. MLA caches one "
        "512+64 latent per layer (no factor 2)."
    )


def _fragmentation(plan: CapacityPlan) -> None:
    cols = st.columns(3)
    prompt = cols[0].number_input(
        "Mean prompt tokens",
        1,
        1_000_000,
        512,
        key=KEY + "fr_p",
        help="Every request gets this prompt length.",
    )
    mean_out = cols[1].number_input(
        "Mean output tokens",
        1,
        1_000_000,
        256,
        key=KEY + "fr_o",
        help="Mean of the output-length distribution.",
    )
    kind = cols[2].selectbox(
        "Output distribution",
        [d.value for d in LengthDistribution],
        index=2,
        key=KEY + "fr_kind",
        help="Deterministic quantiles of the distribution.",
    )
    reserve = max(plan.max_model_len, int(prompt) + 1)
    outputs = output_lengths(str(kind), float(mean_out), reserve - int(prompt))
    result = fragmentation(int(prompt), outputs, reserve, plan.block_size)
    st.plotly_chart(
        charts.fragmentation_figure(result.contiguous_waste, result.paged_waste),
        key=KEY + "frag",
    )
    st.caption(
        f"Contiguous: each request reserves {reserve:,} tokens (the max model length) up "
        f"front. Paged: {plan.block_size}-token blocks as tokens arrive, so only the last "
        f"block is partly empty. Paged fits {result.capacity_gain:.1f}x more requests in "
        "the same memory."
    )


def _side_by_side(base: PlanRequest) -> None:
    cols = st.columns(3)
    defaults = (
        ("llama-3.1-8b", "h100-sxm", "auto"),
        ("llama-3.1-8b", "h100-sxm", "fp8"),
        ("llama-3.1-70b", "h100-sxm", "fp8"),
    )
    rows = []
    for i, (col, (model, gpu_key, kv)) in enumerate(zip(cols, defaults, strict=True)):
        with col:
            names = preset_names()
            name = st.selectbox("Model", names, index=names.index(model), key=f"{KEY}cmp{i}_m")
            gpus = [g.key for g in catalog()]
            gkey = st.selectbox("GPU", gpus, index=gpus.index(gpu_key), key=f"{KEY}cmp{i}_g")
            n = st.number_input("GPUs", 1, 512, 4 if i == 2 else 1, key=f"{KEY}cmp{i}_n")
            kvs = kv_dtype_choices(load_preset(name))
            kv_choice = st.selectbox("KV dtype", kvs, index=kvs.index(kv), key=f"{KEY}cmp{i}_k")
            try:
                plan = plan_capacity(
                    replace(
                        base,
                        model=load_preset(name),
                        gpu=get_gpu(gkey),
                        num_gpus=int(n),
                        tp=None,
                        pp=1,
                        kv_dtype=str(kv_choice),
                        weights_dtype="auto",
                        model_dtype="auto",
                        block_size=None,
                        max_model_len=None,
                        kv_cache_memory_bytes=None,
                        context=None,
                    )
                )
            except KvscopeError as err:
                st.error(str(err))
                continue
            context = min(base.context or plan.max_model_len, plan.max_model_len)
            plan = plan_capacity(replace(plan.request, context=context))
            st.metric(
                "KV capacity (tokens)",
                f"{plan.kv_capacity_tokens:,}",
                help="Per replica, vLLM's 'KV cache size'.",
            )
            st.metric(
                f"Sequences of {context:,}",
                f"{plan.max_sequences * plan.replicas:,}",
                help="Across all replicas, after vLLM's null block.",
            )
            rows.append(
                {
                    "config": f"{name} on {n}x {gkey} ({plan.kv_dtype})",
                    "weights/GPU GiB": round(plan.weights_bytes_per_gpu / GIB, 2),
                    "KV/GPU GiB": round(plan.memory.kv_cache_bytes / GIB, 2),
                    "KV bytes/token": plan.kv_bytes_per_token,
                    "tokens": plan.kv_capacity_tokens,
                    "sequences": plan.max_sequences * plan.replicas,
                }
            )
    if rows:
        table = pd.DataFrame(rows)
        st.dataframe(table, hide_index=True)
        st.plotly_chart(
            charts.comparison_figure(
                list(table["config"]),
                list(table["sequences"]),
                "Sequences that fit, per configuration",
            ),
            key=KEY + "cmp_chart",
        )
        st.caption("Each column keeps this page's context; everything else is the defaults.")


def _what_to_buy(req: PlanRequest, plan: CapacityPlan) -> None:
    cols = st.columns(2)
    context = cols[0].number_input(
        "Target context",
        1,
        req.model.max_position_embeddings,
        plan.context,
        key=KEY + "buy_ctx",
        help="Tokens per sequence you must serve.",
    )
    want = cols[1].number_input(
        "Target concurrency",
        1,
        1_000_000,
        64,
        key=KEY + "buy_n",
        help="Sequences of that context at once.",
    )
    try:
        best = smallest_deployment(req, int(context), int(want))
    except KvscopeError as err:
        st.error(str(err))
        return
    st.metric(
        f"GPUs needed ({req.gpu.name if req.gpu else 'GPU'})",
        f"{best.num_gpus}",
        delta=f"tp {best.tp} x pp {best.pp} x {best.replicas} replica(s), "
        f"{best.sequences:,} sequences",
        delta_color="off",
        help="Smallest GPU count (then fewest pipeline stages) whose replicas together hold "
        "the target; TP within one 8-GPU node.",
    )


def render() -> None:
    """The Planner page; a KvscopeError raised here reaches the console's error boundary."""
    st.title("Planner")
    st.caption(
        "KV cache capacity as vLLM allocates it: budget = memory x utilization minus "
        "weights and overheads; blocks = budget // page bytes // layers."
    )
    with st.expander("Model, hardware and settings", expanded=True):
        arch = _pick_model()
        if arch is None:
            return
        req = _request(arch)
    plan = plan_capacity(req)
    st.subheader(f"{arch.name} on {req.num_gpus} x {req.gpu.name if req.gpu else 'CPU'}")
    st.caption(
        f"{arch.attention_kind} attention, {arch.num_layers} layers, {arch.num_kv_heads} KV "
        f"heads x {arch.head_dim}; tp {plan.tp}, pp {plan.pp}, {plan.replicas} replica(s)."
    )
    _metrics(plan)
    st.plotly_chart(
        charts.memory_breakdown_figure(plan.breakdown(), "Memory of the fullest GPU"),
        key=KEY + "mem",
    )
    st.caption(
        "Weights (counted from the config), KV cache (whole blocks), activation peak of "
        "vLLM's profiling run, non-torch memory and CUDA graphs (estimates), and what "
        "gpu_memory_utilization leaves unused."
    )
    st.subheader("Concurrency and the OOM frontier")
    _curves(req, plan)
    st.subheader("MHA vs GQA vs MQA vs MLA")
    _attention(req, plan)
    st.subheader("Fragmentation: contiguous vs paged")
    _fragmentation(plan)
    st.subheader("Side by side")
    _side_by_side(req)
    st.subheader("What to buy")
    _what_to_buy(req, plan)
    st.subheader("From a startup log")
    _from_log(req)


def _engine_logs() -> dict[str, str]:
    """Managed engines' log files on this machine, by engine name."""
    root = common.settings().data_dir / "engines"
    if not root.is_dir():
        return {}
    return {p.parent.name: str(p) for p in sorted(root.glob("*/engine.log"))}


def _log_lines(key: str) -> list[str] | None:
    engines = _engine_logs()
    sources = ["Upload a vLLM startup log", *(f"Managed engine {n}" for n in engines)]
    source = st.radio("Log", sources, horizontal=True, key=key + "src")
    if source == sources[0]:
        uploaded = st.file_uploader("vLLM startup log", key=key + "upload")
        if uploaded is None:
            st.info(
                "Upload a vLLM startup log (the output of `vllm serve` up to 'Application "
                "startup complete'): the planner takes its flags and GPU total, predicts its "
                "memory and sets each line beside what vLLM measured."
            )
            return None
        return uploaded.getvalue().decode("utf-8", errors="replace").splitlines()
    path = engines[source.removeprefix("Managed engine ")]
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def _study_tables(study: LogStudy) -> None:
    st.caption(
        (study.predicted.accounting.label if study.predicted.accounting else "")
        + f"; tp {study.predicted.tp}, pp {study.predicted.pp}, utilization "
        f"{study.predicted.memory.utilization:g}."
    )
    rows = []
    for ln in study.lines:
        scale = 1 if ln.name == "KV tokens" else GIB
        unit = "tokens" if ln.name == "KV tokens" else "GiB"
        rows.append(
            {
                "": ln.name,
                "measured": None if ln.measured is None else round(ln.measured / scale, 2),
                "predicted": round(ln.predicted / scale, 2),
                "unit": unit,
                "error": None if ln.error is None else f"{ln.error:+.1%}",
            }
        )
    st.dataframe(pd.DataFrame(rows), hide_index=True, key=KEY + "log_lines")
    if study.replans:
        st.caption("Re-planned with the overheads the log measured:")
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "KV dtype": p.vllm_kv_cache_dtype,
                        "context": p.context,
                        "KV tokens": p.kv_capacity_tokens,
                        "sequences that fit": p.max_sequences,
                        "max_num_seqs": p.max_num_seqs,
                    }
                    for p in study.replans
                ]
            ),
            hide_index=True,
            key=KEY + "log_replans",
        )


def _from_log(req: PlanRequest) -> None:
    """A real start against the plan: the model and GPU chosen above, the flags and memory
    the log prints; re-plans at this page's context and KV dtype."""
    lines = _log_lines(KEY + "log_")
    if lines is None:
        return
    report = read_startup(lines)
    if not report.found:
        st.warning("No vLLM memory lines in this log: it did not reach the memory profiling.")
        return
    kinds = (req.kv_dtype,) if req.kv_dtype != "auto" else ("auto", "fp8")
    try:
        study = study_log(
            report,
            req.model,
            req.gpu,
            weights_dtype=req.weights_dtype,
            kv_dtypes=kinds,
            context=req.context,
        )
    except KvscopeError as exc:
        st.error(str(exc))
        return
    _study_tables(study)
