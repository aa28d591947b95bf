"""`kvscope plan`: KV capacity and memory of a model on a GPU, as vLLM would allocate it.

A Typer command function; app/cli/__init__.py registers it as the `plan` command.
Bad input raises planner.errors subclasses, which the CLI's main() prints as one line.
"""

from __future__ import annotations

import json
import re

import typer

from planner.capacity import CapacityPlan, PlanRequest, plan_capacity
from planner.errors import InvalidInput
from planner.gpus import CPU_DEVICE, GIB, get_gpu
from planner.models import load_model

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
        ("KV capacity", f"{plan.kv_capacity_tokens:,} tokens"),
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
    gpu_memory_utilization: float = typer.Option(
        0.9, "--gpu-memory-utilization", help="Share of GPU memory vLLM may use."
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
    max_num_batched_tokens: int = typer.Option(
        8192, "--max-num-batched-tokens", help="vLLM's prefill token budget per step."
    ),
    enforce_eager: bool = typer.Option(
        False, "--enforce-eager", help="No CUDA graphs (no graph memory reserved)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Plan KV cache capacity of a model on a GPU, as vLLM would allocate it."""
    arch = load_model(model)
    device = None if gpu.strip().lower() == CPU_DEVICE else get_gpu(gpu)
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
        enforce_eager=enforce_eager,
    )
    result = plan_capacity(request)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(render_table(result))
