"""Time to compute the whole Planner page for every preset; target: under 50 ms in all.

Per preset: the main plan, plans for 4 KV dtypes, their concurrency curves (64 contexts),
their fits maps (64 contexts x 64 batch sizes) and OOM frontiers, the MHA/GQA/MQA/MLA
comparison and the fragmentation comparison. Prints the median of several runs.
Run: .venv/bin/python benchmarks/planner.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# This file is itself named planner.py: take its folder off the import path (and put the
# repository first) so that `planner` below is the package, not this script.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from planner.capacity import (  # noqa: E402
    PlanRequest,
    concurrency_at,
    fits_map,
    plan_capacity,
    plans_by_kv_dtype,
)
from planner.fragmentation import fragmentation, output_lengths  # noqa: E402
from planner.gpus import get_gpu  # noqa: E402
from planner.kv import vllm_kv_cache  # noqa: E402
from planner.models import attention_variants, load_preset, preset_names  # noqa: E402

KV_DTYPES = ("auto", "fp8", "int8", "int4")
# Enough GPUs for each preset to hold its weights, as a planner would pick.
GPUS = {
    "llama-2-70b": ("h100-sxm", 4),
    "llama-3.1-70b": ("h100-sxm", 4),
    "qwen2.5-72b": ("h100-sxm", 4),
    "mixtral-8x7b": ("h100-sxm", 2),
    "llama-3.1-405b": ("h200", 8),
    "deepseek-v3": ("h200", 8),
}


def full_page(name: str) -> int:
    """Everything the Planner page computes for one model; returns a checksum."""
    gpu, count = GPUS.get(name, ("h100-sxm", 1))
    arch = load_preset(name)
    context = min(8192, arch.max_position_embeddings)
    req = PlanRequest(model=arch, gpu=get_gpu(gpu), num_gpus=count, context=context, batch=16)
    plan = plan_capacity(req)
    checksum = plan.num_blocks
    contexts = np.unique(np.geomspace(plan.block_size, plan.max_model_len, 64).astype(np.int64))
    grid_ctx = np.linspace(plan.block_size, plan.max_model_len, 64).astype(np.int64)
    batches = np.arange(1, 65)
    for kv_plan in plans_by_kv_dtype(req, KV_DTYPES).values():
        checksum += int(concurrency_at(kv_plan, contexts).sum())
        grid = fits_map(kv_plan, grid_ctx, batches)
        checksum += int(grid.fits.sum()) + int(grid.frontier.sum())
    for variant in attention_variants(arch).values():
        checksum += vllm_kv_cache(variant, max(plan.memory.kv_cache_bytes, 0)).num_blocks
    outputs = output_lengths("exponential", 256, max(plan.max_model_len - 512, 1))
    checksum += fragmentation(512, outputs, plan.max_model_len, plan.block_size).paged_token_steps
    return checksum


def main() -> None:
    """Print the median time to compute the page for all presets."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    names = preset_names()
    start = time.perf_counter()
    for name in names:  # first run: reads the preset files and fills the caches
        full_page(name)
    cold = time.perf_counter() - start
    times: list[float] = []
    per_model: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.runs):
        t0 = time.perf_counter()
        for name in names:
            t1 = time.perf_counter()
            full_page(name)
            per_model[name].append(time.perf_counter() - t1)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    print(f"presets: {len(names)}; per preset: 4 KV dtypes x (64-context curve + 64x64 fits map)")
    print(f"first run (cold caches): {cold * 1e3:.1f} ms")
    print(
        f"full page, all presets, median of {args.runs}: {median * 1e3:.1f} ms "
        f"(target < 50 ms: {'met' if median < 0.050 else 'MISSED'})"
    )
    slowest = sorted(per_model.items(), key=lambda kv: -statistics.median(kv[1]))[:3]
    for name, values in slowest:
        print(f"  slowest: {name:16s} {statistics.median(values) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
