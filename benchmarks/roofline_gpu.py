"""The roofline step cost (planner/simulate/roofline.py) against a real GPU's forward steps.

The roofline's efficiencies (MEMORY_EFFICIENCY of the datasheet bandwidth, COMPUTE_EFFICIENCY
of the BF16 peak) and its STEP_OVERHEAD_S are stated, not measured. This writes what
benchmarks/gpu_steps.py times on a GPU machine (the model's shapes and the cases, each with
the roofline's prediction and its parts), then reads back what it measured: the roofline's
error per case and the efficiencies the GPU really reached.

    .venv/bin/python -m benchmarks.roofline_gpu spec --model llama-3.1-8b --gpu h200 \\
        --out benchmarks/measured/h200-2026-12-04/spec-llama-3.1-8b.json
    # on the GPU machine (torch only):  python -u benchmarks/gpu_steps.py SPEC OUT
    .venv/bin/python -m benchmarks.roofline_gpu compare SPEC OUT

The cases: decode steps (B sequences over C cached tokens), whole prefills (T tokens), and
mixed steps (B decodes and a fresh prompt's chunk of T tokens in one forward, as vLLM V1
runs chunked prefill; B + T a usual max_num_batched_tokens), each predicted as the
simulator's engine counts that step.

`spec --tiny` writes a 2-layer, 64-wide model and small cases, for a CPU run of
gpu_steps.py that tests the path end to end; its predictions are the roofline's for that
tiny model on the named GPU, so against a CPU's timings they mean nothing (compare says so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from planner.capacity import CapacityPlan, PlanRequest, plan_capacity
from planner.gpus import get_gpu
from planner.models import ModelArch, from_config_dict, load_preset
from planner.simulate.engine import StepCost, pairs_of
from planner.simulate.roofline import (
    COMPUTE_EFFICIENCY,
    MEMORY_EFFICIENCY,
    STEP_OVERHEAD_S,
    roofline_cost,
)

# (batch, cached tokens per sequence): from one sequence (the weights' read alone) to 128
# (KV reads about twice the weights'), each cache under 40 GB for Llama-3.1-8B's 128 KiB a
# token (32 x 8,192 and 128 x 2,048 are 32 GiB).
DECODE_CASES = [(1, 512), (1, 8192), (8, 2048), (32, 2048), (64, 1024), (128, 512), (32, 8192),
                (128, 2048)]  # fmt: skip
PREFILL_CASES = [512, 2048, 8192]
# (decodes, cached tokens each, chunk): one step of chunked prefill, the decodes taking their
# token each and a prompt's first chunk the rest of a max_num_batched_tokens of 512 or 2,048.
MIXED_CASES = [(32, 2048, 480), (64, 1024, 448), (8, 2048, 2040), (128, 512, 384)]
MAX_KV_GB = 40.0
BUDGET_S = 150.0  # gpu_steps.py skips the cases left after this (the run stays under 3 min)
# The tiny model of `--tiny`: Llama-shaped, GQA (4 query heads over 2 KV heads).
TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
TINY_DECODE = [(1, 16), (4, 64), (16, 128)]
TINY_PREFILL = [64, 256]
TINY_MIXED = [(4, 64, 60), (16, 128, 48)]
TINY_RUN: dict[str, Any] = {"copy_bytes": 1 << 24, "matmul_n": 256}


def build_plan(model: str, gpu: str, tiny: bool) -> CapacityPlan:
    """One replica on one GPU, as the other benchmarks plan it (max_model_len 8,192, or the
    model's own when shorter; the roofline does not depend on it)."""
    arch = from_config_dict(TINY_CONFIG, name="tiny-llama") if tiny else load_preset(model)
    max_len = min(8192, arch.max_position_embeddings)
    req = PlanRequest(model=arch, gpu=get_gpu(gpu), num_gpus=1, max_model_len=max_len)
    return plan_capacity(req)


def check_buildable(plan: CapacityPlan) -> None:
    """gpu_steps.py builds a dense Llama-shaped decoder on one GPU in bf16: refuse others."""
    arch = plan.request.model
    why = [
        text
        for bad, text in (
            (arch.mla is not None, "MLA"),
            (arch.moe is not None, "mixture of experts"),
            (arch.has_sliding_window, "sliding windows"),
            (arch.qkv_bias or arch.o_bias or arch.mlp_bias, "biases"),
            (arch.qk_norm, "QK norms"),
            (arch.norms_per_layer != 2, "other than two norms a layer"),
            (arch.quant is not None, "quantized weights"),
            (arch.vision_params > 0, "a vision tower"),
            (plan.tp * plan.pp != 1, "more than one GPU"),
            (plan.weights_dtype != "bfloat16" or plan.kv_dtype != "bfloat16", "not bf16"),
        )
        if bad
    ]
    if why:
        raise SystemExit(f"{arch.name}: gpu_steps.py does not build {', '.join(why)}")


def model_shapes(arch: ModelArch) -> dict[str, Any]:
    """The shapes gpu_steps.py builds, from the planner's model data."""
    return {
        "name": arch.name,
        "hidden_size": arch.hidden_size,
        "num_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_kv_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "intermediate_size": arch.intermediate_size,
        "vocab_size": arch.vocab_size,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "rms_norm_eps": 1e-5,  # (not in ModelArch; no bearing on the time)
        "rope_theta": 500000.0,
        "dtype": "bfloat16",
    }


def prediction(
    plan: CapacityPlan, cost: StepCost, tokens: int, kv_tokens: int, seqs: int, pairs: int
) -> dict[str, Any]:
    """The roofline's step time and its parts, with the bytes and FLOPs it counts."""
    memory = cost.weights_read_s + kv_tokens * cost.kv_token_read_s
    compute = tokens * cost.token_compute_s
    total = cost.step_s(tokens, kv_tokens, seqs, pairs)
    assert abs(total - (cost.overhead_s + max(memory, compute))) < 1e-12, "step_s changed"
    return {
        "tokens": tokens,
        "kv_tokens": kv_tokens,
        "seqs": seqs,
        "pairs": pairs,
        "memory_s": memory,
        "compute_s": compute,
        "overhead_s": cost.overhead_s,
        "total_s": total,
        "bound": "memory" if memory >= compute else "compute",
        "bytes": plan.weights_bytes_per_gpu + kv_tokens * plan.kv_bytes_per_token_per_gpu,
        "flops": tokens * 2 * plan.active_params // (plan.tp * plan.pp),
    }


def make_spec(
    plan: CapacityPlan,
    decode: list[tuple[int, int]],
    prefill: list[int],
    mixed: list[tuple[int, int, int]],
    max_kv_gb: float,
    budget_s: float,
    tiny: bool,
) -> dict[str, Any]:
    """The spec gpu_steps.py reads: shapes, run settings, and each case with the roofline's
    prediction (compare reads the rest)."""
    check_buildable(plan)
    gpu = plan.request.gpu
    assert gpu is not None and gpu.bandwidth_gbs and gpu.bf16_tflops
    cost = roofline_cost(plan)
    # gpu_steps.py holds the weights throughout and one case's cache at a time; a tenth of
    # the memory is left for activations, graph pools and torch's own.
    room = 0.9 * gpu.visible_bytes - plan.weights_bytes_per_gpu
    if room <= 0:
        raise SystemExit(f"{plan.request.model.name}'s weights do not fit one {gpu.name}")
    cases: list[dict[str, Any]] = []
    for b, c in decode:
        kv_bytes = b * (c + 1) * plan.kv_bytes_per_token_per_gpu
        if kv_bytes > min(max_kv_gb * 1e9, room):
            print(f"decode B={b} C={c} left out: its KV is {kv_bytes / 1e9:.1f} GB", flush=True)
            continue
        # As the engine's decode step counts (engine.decode_step): B tokens, each attending
        # over its C cached tokens and itself, so kv_tokens = pairs = B*C + B.
        kv = b * c + b
        cases.append({
            "id": f"decode B={b} C={c}", "kind": "decode", "batch": b, "context": c,
            "roofline": prediction(plan, cost, b, kv, b, kv),
        })  # fmt: skip
    for t in prefill:
        # As the engine's step counts a prompt scheduled whole with nothing cached
        # (engine.step): kv_tokens = cached + chunk = T (its own K and V, read once), pairs
        # = pairs_of(T, 0) = T(T+1)/2. The roofline has no cost per pair (pair_s = 0), so a
        # long prefill's quadratic attention is not in its prediction.
        cases.append({
            "id": f"prefill T={t}", "kind": "prefill", "tokens": t,
            "roofline": prediction(plan, cost, t, t, 1, pairs_of(t, 0)),
        })  # fmt: skip
    for b, c, t in mixed:
        kv_bytes = (b * (c + 1) + t) * plan.kv_bytes_per_token_per_gpu
        if kv_bytes > min(max_kv_gb * 1e9, room):
            print(
                f"mixed B={b} C={c} T={t} left out: its KV is {kv_bytes / 1e9:.1f} GB", flush=True
            )
            continue
        # As the engine counts a step of B running decodes into which a waiting prompt's first
        # chunk of T tokens, nothing of it cached, is admitted (engine._Engine.decode_step;
        # _Engine.step counts the same): tokens = B + T; kv_tokens = context + B + cached +
        # chunk = B*C + B + T; pairs = context + B + pairs_of(T, 0); seqs = B + 1.
        kv, pairs = b * c + b + t, b * c + b + pairs_of(t, 0)
        cases.append({
            "id": f"mixed B={b} C={c} T={t}", "kind": "mixed", "batch": b, "context": c,
            "chunk": t, "roofline": prediction(plan, cost, b + t, kv, b + 1, pairs),
        })  # fmt: skip
    run: dict[str, Any] = {**(TINY_RUN if tiny else {}), "budget_s": budget_s}
    return {
        "kind": "kvscope.gpu_steps.spec",
        "version": 1,
        "tiny": tiny,
        "model": model_shapes(plan.request.model),
        "run": run,
        "plan": {
            "model": plan.request.model.name,
            "gpu": gpu.key,
            "gpu_name": gpu.name,
            "bandwidth_gbs": gpu.bandwidth_gbs,
            "bf16_tflops": gpu.bf16_tflops,
            "tp": plan.tp,
            "pp": plan.pp,
            "params": plan.params,
            "active_params": plan.active_params,
            "weights_bytes_per_gpu": plan.weights_bytes_per_gpu,
            "kv_bytes_per_token_per_gpu": plan.kv_bytes_per_token_per_gpu,
            "memory_efficiency": MEMORY_EFFICIENCY,
            "compute_efficiency": COMPUTE_EFFICIENCY,
            "step_overhead_s": STEP_OVERHEAD_S,
            "step_cost": asdict(cost),
        },
        "cases": cases,
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _err(pred: float | None, meas: float | None) -> str:
    """The prediction's error as the other benchmarks state it: predicted/measured - 1."""
    return "-" if pred is None or not meas else f"{pred / meas - 1:+.1%}"


def _median(case: dict[str, Any], key: str) -> float | None:
    got = case.get(key)
    return float(got["median_s"]) if isinstance(got, dict) and "median_s" in got else None


def _step(case: dict[str, Any]) -> tuple[float | None, str]:
    """The measured step the roofline is scored on: the CUDA graph's where there is one (vLLM
    replays decode steps from graphs), else the eager one."""
    graph = _median(case, "graph")
    return (graph, "graph") if graph is not None else (_median(case, "eager"), "eager")


def _device_note(spec: dict[str, Any], measured: dict[str, Any]) -> list[str]:
    """Warnings when the measurement is not of the GPU the predictions are for."""
    env, plan = measured.get("env", {}), spec["plan"]
    notes: list[str] = []
    name = str(env.get("gpu_name") or "")
    if env.get("device") != "cuda":
        notes.append(
            f"measured on {env.get('device')}, not on an {plan['gpu_name']}: the errors and "
            "efficiencies below are against that GPU's datasheet and mean nothing here"
        )
    elif plan["gpu"].split("-")[0] not in name.lower():
        notes.append(f"measured on {name}, predicted for {plan['gpu_name']}")
    if spec.get("tiny"):
        notes.append("a tiny model (--tiny): a test of the path, not a measurement")
    if not measured.get("done"):
        notes.append("the run did not finish: the cases it did not reach are missing")
    if measured.get("params") != plan["params"]:
        notes.append(
            f"the model built has {measured.get('params'):,} parameters, the planner counts "
            f"{plan['params']:,}"
        )
    return notes


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of one spec as one: each timing and ceiling the median of the runs that
    have it (the first run's other fields)."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = json.loads(json.dumps(runs[0]))
    out["done"] = all(r.get("done") for r in runs)
    for name, field in (("copy", "gb_per_s"), ("matmul", "tflops")):
        values = [r["ceilings"][name][field] for r in runs if field in r["ceilings"][name]]
        if values:
            out["ceilings"][name][field] = statistics.median(values)
    by_id = [{c["id"]: c for c in r.get("cases", [])} for r in runs]
    for case in out.get("cases", []):
        for key in ("graph", "eager", "attention"):
            values = [
                v for got in by_id if (v := _median(got.get(case["id"], {}), key)) is not None
            ]
            if values:
                case.setdefault(key, {})["median_s"] = statistics.median(values)
    return out


def compare(spec: dict[str, Any], measured: dict[str, Any]) -> str:
    """Markdown: the ceilings, each case's prediction against its measurement, and the
    efficiencies the measurements suggest."""
    plan = spec["plan"]
    bw = float(plan["bandwidth_gbs"]) * 1e9
    peak = float(plan["bf16_tflops"]) * 1e12
    env = measured.get("env", {})
    out = [
        f"## Roofline against {env.get('gpu_name') or env.get('device')}: {plan['model']}, "
        f"roofline for {plan['gpu_name']}",
        "",
        f"torch {env.get('torch')}, CUDA {env.get('cuda')}; datasheet {plan['bandwidth_gbs']:,g}"
        f" GB/s and {plan['bf16_tflops']:,g} BF16 TFLOP/s; the roofline assumes "
        f"{plan['memory_efficiency']:.0%} and {plan['compute_efficiency']:.0%} of them and "
        f"{plan['step_overhead_s'] * 1e3:g} ms a step.",
        "",
    ]
    out += [f"> **Note:** {note}" for note in _device_note(spec, measured)]
    ceil = measured.get("ceilings", {})
    copy, mm = ceil.get("copy", {}), ceil.get("matmul", {})
    out += [
        "",
        "| ceiling | measured | datasheet | share |",
        "|---|---|---|---|",
        f"| device copy (bytes read + written) | {copy.get('gb_per_s', 0):,.0f} GB/s | "
        f"{plan['bandwidth_gbs']:,g} GB/s | {_pct(copy.get('gb_per_s', 0) * 1e9 / bw)} |"
        if "gb_per_s" in copy
        else f"| device copy | {copy.get('error', 'not measured')} | | |",
        f"| bf16 matmul {mm.get('n')}³ | {mm['tflops']:,.1f} TFLOP/s | "
        f"{plan['bf16_tflops']:,g} TFLOP/s | {_pct(mm['tflops'] * 1e12 / peak)} |"
        if "tflops" in mm
        else f"| bf16 matmul | {mm.get('error', 'not measured')} | | |",
        "",
    ]
    got = {c["id"]: c for c in measured.get("cases", [])}
    mem_eff: list[tuple[float, float]] = []  # (roofline bytes, measured s), memory-bound
    comp_eff: list[tuple[float, float]] = []  # (roofline FLOPs, measured s), compute-bound
    launches: dict[str, list[float]] = {}  # eager - graph, by the case's kind
    out += [
        "| case | bound | predicted ms | w/o overhead ms | measured graph ms | measured eager "
        "ms | error vs graph | w/o overhead vs graph | predicted vs eager | implied efficiency"
        " (roofline's count) | reached (bytes or FLOPs run) | attention ms (its KV read) |"
        " attention |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in spec["cases"]:
        pred = case["roofline"]
        m = got.get(case["id"], {})
        bound = pred["bound"]
        kernel = pred["total_s"] - pred["overhead_s"]
        graph, eager = _median(m, "graph"), _median(m, "eager")
        step, which = _step(m)
        if m.get("error") or m.get("skipped") or step is None:
            why = m.get("error") or m.get("skipped") or "not measured"
            out.append(
                f"| {case['id']} | {bound} | {_ms(pred['total_s'])} | {_ms(kernel)} | {why} |"
                + " |" * 8
            )
            continue
        if bound == "memory":
            implied = pred["bytes"] / bw / step
            reached = (m["weights_read_bytes"] + m.get("kv_read_bytes", 0)) / step / bw
            mem_eff.append((pred["bytes"], step))
        else:
            implied = pred["flops"] / peak / step
            reached = m["flops"] / step / peak
            comp_eff.append((pred["flops"], step))
        if graph is not None and eager is not None:
            launches.setdefault(case.get("kind", "decode"), []).append(eager - graph)
        tag = "" if which == "graph" else " (eager)"
        attn = _median(m, "attention")
        attn_bw = (
            f"{_ms(attn)} ({_pct(m['kv_read_bytes'] / attn / bw)})"
            if attn and m.get("kv_read_bytes")
            else "-"
        )
        out.append(
            f"| {case['id']} | {bound} | {_ms(pred['total_s'])} | {_ms(kernel)} | "
            f"{_ms(graph)} | {_ms(eager)} | {_err(pred['total_s'], step)}{tag} | "
            f"{_err(kernel, step)}{tag} | "
            f"{_err(pred['total_s'], eager)} | {_pct(implied)} {bound} | {_pct(reached)} | "
            f"{attn_bw} | {m.get('attention_backend', '-')} |"
        )
    out += [
        "",
        "Errors are predicted / measured - 1, against the CUDA graph's step where there is one"
        " (vLLM replays decode steps from graphs), else the eager one. Implied efficiency: the "
        "share of the datasheet figure (bandwidth where the roofline is memory-bound, BF16 "
        "peak where compute-bound) at which the roofline's own count (weights + kv_tokens x KV"
        " bytes a token; 2 x active parameters a token) takes the measured time: the "
        "efficiency that makes the roofline without its overhead exact. Reached: the same "
        "with what the step runs (the weights less the embedding rows not looked up, and "
        "every sequence's KV; or the projections, attention's QK and PV, and the lm_head for "
        "the last tokens only). Attention: every layer's attention alone, from a CUDA graph;"
        " in brackets the share of the datasheet bandwidth its KV read reaches.",
        *_mixed_note(spec["cases"]),
        "",
        *summary(plan, bw, peak, mem_eff, comp_eff, launches, spec["cases"], got),
    ]
    return "\n".join(out)


def _mixed_note(cases: list[dict[str, Any]]) -> list[str]:
    """What a mixed case is and how it is counted (nothing when the spec has none)."""
    if not any(case.get("kind") == "mixed" for case in cases):
        return []
    return [
        "",
        "Mixed B, C, T: one step of chunked prefill, B decodes over C cached tokens and the "
        "first chunk of T tokens of a fresh prompt (taken to end there, so that it samples) "
        "in one forward: one GEMM of B + T rows a projection, attention in two SDPA calls a "
        "layer (the decodes', the chunk's; both kernels named), logits for B + 1 tokens. The"
        " roofline counts it as the engine does (B + T tokens attending B x C + B + T). Its "
        "graph replays the whole step; vLLM replays a mixed step from piecewise graphs, "
        "attention eagerly between them, and runs one past its largest captured size "
        "eagerly: its forward lies roughly between the graph's figure and the eager one. Its "
        "attention column counts the decodes' caches and the chunk's own K and V as its KV"
        " read, though the chunk's part is bound by compute.",
    ]


def summary(
    plan: dict[str, Any],
    bw: float,
    peak: float,
    mem: list[tuple[float, float]],
    comp: list[tuple[float, float]],
    launches: dict[str, list[float]],
    cases: list[dict[str, Any]],
    got: dict[str, dict[str, Any]],
) -> list[str]:
    """What the measurements suggest for the roofline's constants, and the error it would
    have with them."""
    lines = ["### What the measurements suggest", ""]
    suggested: dict[str, float] = {}
    for name, key, ceiling, pts in (
        ("MEMORY_EFFICIENCY", "memory_efficiency", bw, mem),
        ("COMPUTE_EFFICIENCY", "compute_efficiency", peak, comp),
    ):
        if not pts:
            lines.append(f"- {name}: no case bound by it was measured.")
            continue
        per = [x / ceiling / s for x, s in pts]
        suggested[key] = statistics.median(per)
        lines.append(
            f"- {name}: {suggested[key]:.3f} (median of {len(pts)} cases, {min(per):.3f} to "
            f"{max(per):.3f}; the roofline assumes {plan[key]:g})"
        )
    if decodes := launches.get("decode"):
        mid = statistics.median(decodes)
        lines.append(
            f"- eager minus CUDA graph, a decode step: median {mid * 1e3:.3f} ms "
            f"({min(decodes) * 1e3:.3f} to {max(decodes) * 1e3:.3f}): the launches a "
            f"graph saves. The roofline's {plan['step_overhead_s'] * 1e3:g} ms a step stands "
            "for more (scheduling, sampling, detokenising, streaming), which this forward "
            "pass does not run."
        )
    if mixes := launches.get("mixed"):
        mid = statistics.median(mixes)
        lines.append(
            f"- eager minus CUDA graph, a mixed step: median {mid * 1e3:.3f} ms "
            f"({min(mixes) * 1e3:.3f} to {max(mixes) * 1e3:.3f})."
        )
    if suggested:
        # Each measured case predicted again with the suggested efficiencies (the assumed
        # one where no case was bound by it) and no overhead.
        mem_eff = suggested.get("memory_efficiency", plan["memory_efficiency"])
        comp_eff = suggested.get("compute_efficiency", plan["compute_efficiency"])
        errs: list[float] = []
        for case in cases:
            step, _ = _step(got.get(case["id"], {}))
            if step is None:
                continue
            pred = case["roofline"]
            again = max(pred["bytes"] / (bw * mem_eff), pred["flops"] / (peak * comp_eff))
            errs.append(again / step - 1)
        if errs:
            worst = max(errs, key=abs)
            lines.append(
                f"- with those efficiencies and no overhead, the roofline against the measured "
                f"steps: median |error| {statistics.median(abs(e) for e in errs):.1%}, worst "
                f"{worst:+.1%} ({len(errs)} cases)"
            )
    return lines


def _pairs(text: str) -> list[tuple[int, int]]:
    """'1x512,8x2048' -> [(1, 512), (8, 2048)]."""
    out = []
    for item in text.split(","):
        b, _, c = item.strip().lower().partition("x")
        out.append((int(b), int(c)))
    return out


def _triples(text: str) -> list[tuple[int, int, int]]:
    """'32x2048x480,8x2048x2040' -> [(32, 2048, 480), (8, 2048, 2040)]."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(f"{item!r}: want BxCxT")
        b, c, t = (int(x) for x in parts)
        out.append((b, c, t))
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("spec", help="write the spec gpu_steps.py runs")
    p.add_argument("--model", default="llama-3.1-8b", help="a catalog model (preset)")
    p.add_argument("--gpu", default="h200", help="a catalog GPU key (h200, h100-sxm, ...)")
    p.add_argument("--out", type=Path, required=True, help="inside the repository: it travels")
    p.add_argument("--tiny", action="store_true", help="a tiny model and cases, for a CPU test")
    p.add_argument("--decode", type=_pairs, default=None, help="BxC,... (default: 8 cases)")
    p.add_argument("--prefill", type=_ints, default=None, help="T,... (default: 512,2048,8192)")
    p.add_argument(
        "--mixed",
        type=_triples,
        default=None,
        help="BxCxT,...: B decodes over C cached tokens and a prompt chunk of T (default: 4 "
        "cases, B+T 512 or 2048)",
    )
    p.add_argument("--max-kv-gb", type=float, default=MAX_KV_GB, help="leave out bigger caches")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="gpu_steps.py's budget")
    c = sub.add_parser("compare", help="the roofline against gpu_steps.py's results")
    c.add_argument("spec", type=Path)
    c.add_argument("measured", type=Path, nargs="+", help="one run or several (medians)")
    args = parser.parse_args(argv)
    if args.command == "spec":
        plan = build_plan(args.model, args.gpu, args.tiny)
        decode = args.decode or (TINY_DECODE if args.tiny else DECODE_CASES)
        prefill = args.prefill or (TINY_PREFILL if args.tiny else PREFILL_CASES)
        mixed = args.mixed or (TINY_MIXED if args.tiny else MIXED_CASES)
        spec = make_spec(plan, decode, prefill, mixed, args.max_kv_gb, args.budget_s, args.tiny)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
        print(f"{len(spec['cases'])} cases for {plan.request.model.name} on {args.gpu}: {args.out}")
        return 0
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    runs = [json.loads(path.read_text(encoding="utf-8")) for path in args.measured]
    print(compare(spec, merged(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
