"""`kvscope plan`: KV capacity and memory of a model on a GPU, as vLLM would allocate it.

A Typer command function; app/cli/__init__.py registers it as the `plan` command.
Bad input raises planner.errors subclasses, which the CLI's main() prints as one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer

from planner.capacity import CapacityPlan, PlanRequest, plan_capacity
from planner.errors import InvalidInput
from planner.gpus import CPU_DEVICE, GIB, GPUSpec, get_gpu
from planner.measured import study_log
from planner.models import ModelArch, load_model
from probes.vllm.logparse import read_startup

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """'1073741824', '1GiB', '1.5 GiB' or '2GB' as a byte count."""
    match = _SIZE.match(text.replace("_", "").replace(",", ""))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise InvalidInput(
            f"cannot read {text!r} as a size; write bytes (1073741824) or a number with "
            "one of the units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"
        )
    return round(float(match.group(1)) * _UNITS[unit])


def _gib(n: int | float) -> str:
    return f"{n / GIB:,.2f} GiB"


def _capacity(plan: CapacityPlan) -> str:
    low, high = plan.kv_capacity_range
    if low == high:
        return f"{low:,} tokens"
    return f"{low:,} - {high:,} tokens (unsure: plan for {low:,})"


def render_table(plan: CapacityPlan) -> str:
    """A plain-text table of the plan, one figure per line."""
    req = plan.request
    m = plan.memory
    device = req.gpu.name if req.gpu is not None else "CPU (explicit KV space)"
    lines = [
        f"{req.model.name} on {req.num_gpus} x {device}: tp {plan.tp}, pp {plan.pp}, "
        f"{plan.replicas} replica(s)",
        "",
    ]
    rows = [
        ("parameters", f"{plan.params:,} ({plan.active_params:,} active per token)"),
        (
            "weights",
            f"{_gib(plan.weights_bytes)} as {plan.weights_dtype}; "
            f"{_gib(plan.weights_bytes_per_gpu)} on the fullest GPU",
        ),
        ("KV dtype", f"{plan.kv_dtype} (vllm --kv-cache-dtype {plan.vllm_kv_cache_dtype})"),
        (
            "KV bytes per token",
            f"{plan.kv_bytes_per_token:,} (replica), {plan.kv_bytes_per_token_per_gpu:,} per GPU",
        ),
        ("block size / page", f"{plan.block_size} tokens / {plan.page_bytes:,} bytes per layer"),
        ("KV cache groups", f"{len(plan.groups)} x {plan.group_size} layers"),
        (
            "KV budget per GPU",
            _gib(m.kv_cache_bytes)
            + (
                " (explicit)"
                if m.explicit_kv
                else f" ({m.utilization:g} x {_gib(m.total_bytes)} minus weights and overheads)"
            ),
        ),
        ("num blocks (per GPU)", f"{plan.num_blocks:,}"),
        ("KV capacity", _capacity(plan)),
        ("batch limits", f"{plan.max_num_batched_tokens:,} tokens, {plan.max_num_seqs:,} seqs"),
        ("accounting", plan.accounting.label if plan.accounting else "-"),
        ("max model length", f"{plan.max_model_len:,} tokens"),
        ("context", f"{plan.context:,} tokens"),
        (
            "KV per sequence",
            f"{plan.kv_bytes_per_sequence:,} bytes ({plan.blocks_per_sequence} blocks)",
        ),
        (
            "max concurrency",
            f"{plan.max_concurrency:.2f}x at {plan.context:,} tokens "
            f"({plan.max_concurrency_at_max_len:.2f}x at max length)",
        ),
        (
            "sequences that fit",
            f"{plan.max_sequences:,} per replica, {plan.max_sequences * plan.replicas:,} in all",
        ),
        (f"batch of {req.batch} fits", "yes" if plan.fits else "no"),
        ("vLLM starts", "yes" if plan.startup_ok else "no"),
    ]
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    lines += ["", "memory of the fullest GPU:"]
    parts = plan.breakdown()
    pw = max(len(k) for k in parts)
    lines += [f"  {k.replace('_', ' '):<{pw}}  {_gib(v):>12}" for k, v in parts.items()]
    if plan.notes:
        lines += ["", *(f"note: {n}" for n in plan.notes)]
    return "\n".join(lines)


def plan(
    model: str = typer.Option(
        ..., "--model", "-m", help="Preset name (e.g. llama-3.1-8b) or path to a config.json."
    ),
    gpu: str = typer.Option(
        ..., "--gpu", "-g", help="Catalog GPU (e.g. h100-sxm), custom:<GiB>, or cpu."
    ),
    num_gpus: int = typer.Option(1, "--num-gpus", help="GPUs in all (replicas x tp x pp)."),
    tp: int | None = typer.Option(
        None, "--tp", help="Tensor parallel size (default: num-gpus / pp)."
    ),
    pp: int = typer.Option(1, "--pp", help="Pipeline parallel size."),
    weights_dtype: str = typer.Option(
        "auto", "--weights-dtype", help="auto, bfloat16, float16, float32, fp8, int8, int4."
    ),
    kv_dtype: str = typer.Option(
        "auto", "--kv-dtype", help="auto, bfloat16, float16, float32, fp8, int8, int4, nvfp4."
    ),
    dtype: str = typer.Option(
        "auto", "--dtype", help="Model dtype as vLLM's --dtype (auto serves fp32 in bf16)."
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None,
        "--gpu-memory-utilization",
        help="Share of GPU memory vLLM may use (default: the release's, 0.9 or 0.92).",
    ),
    kv_memory_bytes: str | None = typer.Option(
        None,
        "--kv-memory-bytes",
        help="Explicit KV size (kv_cache_memory_bytes / VLLM_CPU_KVCACHE_SPACE), e.g. 4GiB.",
    ),
    block_size: int | None = typer.Option(
        None, "--block-size", help="Tokens per block (default 16; 64 for MLA)."
    ),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", help="Max model length (default: the model's)."
    ),
    context: int | None = typer.Option(
        None, "--context", help="Tokens per sequence (default: max model length)."
    ),
    batch: int = typer.Option(1, "--batch", help="Concurrent sequences to test for fit."),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        help="vLLM's token budget per step (default: vLLM's for the GPU, 8192 on H100).",
    ),
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", help="vLLM's max_num_seqs (default: vLLM's for the GPU)."
    ),
    vllm_version: str | None = typer.Option(
        None,
        "--vllm-version",
        help="vLLM release whose memory accounting to use (default: the newest known).",
    ),
    from_log: str | None = typer.Option(
        None,
        "--from-log",
        help="A vLLM startup log: plan its deployment, measured against predicted, and "
        "re-plan the other options with the overheads it measured.",
    ),
    enforce_eager: bool = typer.Option(
        False, "--enforce-eager", help="No CUDA graphs (no graph memory reserved)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Plan KV cache capacity of a model on a GPU, as vLLM would allocate it."""
    arch = load_model(model)
    device = None if gpu.strip().lower() == CPU_DEVICE else get_gpu(gpu)
    if from_log is not None:
        limits = (max_num_batched_tokens, max_num_seqs)
        _from_log(Path(from_log), arch, device, weights_dtype, context, kv_dtype, limits, as_json)
        return
    request = PlanRequest(
        model=arch,
        gpu=device,
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        weights_dtype=weights_dtype,
        model_dtype=dtype,
        kv_dtype=kv_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory_bytes=parse_bytes(kv_memory_bytes) if kv_memory_bytes else None,
        block_size=block_size,
        max_model_len=max_model_len,
        context=context,
        batch=batch,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        enforce_eager=enforce_eager,
        vllm_version=vllm_version,
    )
    result = plan_capacity(request)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(render_table(result))


def _from_log(
    path: Path,
    arch: ModelArch,
    device: GPUSpec | None,
    weights_dtype: str,
    context: int | None,
    kv_dtype: str,
    limits: tuple[int | None, int | None],
    as_json: bool,
) -> None:
    """Measured against predicted for the deployment a log describes, then a re-plan of
    other contexts, KV dtypes and batch limits with the overheads the log measured."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InvalidInput(f"cannot read the log {path}: {exc.strerror or exc}") from exc
    report = read_startup(text.splitlines())
    study = study_log(
        report,
        arch,
        device,
        weights_dtype=weights_dtype,
        kv_dtypes=(kv_dtype,) if kv_dtype != "auto" else ("auto", "fp8"),
        context=context,
        max_num_batched_tokens=limits[0],
        max_num_seqs=limits[1],
    )
    predicted = study.predicted
    label = predicted.accounting.label if predicted.accounting else None
    if as_json:
        doc = {
            "log": str(path),
            "vllm_version": report.version,
            "accounting": label,
            "lines": [
                {
                    "name": ln.name,
                    "unit": "tokens" if ln.name == "KV tokens" else "bytes",
                    "measured": ln.measured,
                    "predicted": ln.predicted,
                    "error": ln.error,
                }
                for ln in study.lines
            ],
            "replans": [p.to_dict() for p in study.replans],
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    out = [
        f"{path.name}: vLLM {report.version or '(version not printed)'}, tp "
        f"{predicted.tp}, pp {predicted.pp}, utilization {predicted.memory.utilization:g}",
        label or "",
        "",
        f"  {'':<28} {'measured':>12} {'predicted':>12} {'error':>8}",
    ]
    for ln in study.lines:
        unit = _gib if ln.name != "KV tokens" else (lambda n: f"{n:,.0f}")
        measured = unit(ln.measured) if ln.measured is not None else "-"
        err = f"{ln.error:+.1%}" if ln.error is not None else ""
        out.append(f"  {ln.name:<28} {measured:>12} {unit(ln.predicted):>12} {err:>8}")
    if study.replans:
        out += ["", "re-planned with the measured overheads:"]
        for p in study.replans:
            out.append(
                f"  KV {p.vllm_kv_cache_dtype:<5} {p.kv_capacity_tokens:>12,} tokens; "
                f"{p.max_sequences:,} sequences of {p.context:,} tokens (batch limits "
                f"{p.max_num_batched_tokens:,} tokens, {p.max_num_seqs:,} sequences)"
            )
    typer.echo("\n".join(out))
