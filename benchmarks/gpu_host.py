"""Two checks that need a real NVIDIA GPU, run on a GPU machine that has torch and the NVML
bindings (nvidia-ml-py) but none of the project's other dependencies:

- the worker's GPU sampler (probes/worker/gpu.py, loaded from its file alone) reads the
  memory a process takes and the utilisation of a busy GPU, and an idle one as idle;
- the memory vLLM sizes its KV cache from, `torch.cuda.mem_get_info()[1]`, against what
  the planner's GPU catalog says (planner/data/gpus.toml's `visible_gib`).

    python -u benchmarks/gpu_host.py OUT.json

Prints what it saw and writes it as JSON; exits 1 when the sampler missed what it should see.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch  # type: ignore[import-not-found,unused-ignore]

GIB = 1 << 30
HOLD_GIB = 20  # what this process takes while the sampler looks
SAMPLER = Path(__file__).resolve().parent.parent / "probes" / "worker" / "gpu.py"


def load_sampler() -> Any:
    """The worker's sampler module from its file alone (the probes package would import the
    project's dependencies, which this machine lacks)."""
    spec = importlib.util.spec_from_file_location("kvscope_gpu_sampler", SAMPLER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def busy(stop: threading.Event) -> None:
    """Back-to-back bf16 matrix products until `stop`: a GPU near 100 % busy."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    while not stop.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def main() -> int:
    out = Path(sys.argv[1])
    free, total = torch.cuda.mem_get_info()
    found: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "mem_get_info_total_bytes": total,
        "mem_get_info_total_gib": total / GIB,
        "mem_get_info_free_gib_at_start": free / GIB,
    }
    print(f"{found['gpu']}: torch.cuda.mem_get_info total {total / GIB:.4f} GiB", flush=True)
    gpu = load_sampler()
    sampler = gpu.GpuSampler()
    found["sampler_message"] = sampler.message
    sampler.sample()  # (the first utilisation reading can cover the time before init)
    time.sleep(1.0)
    idle = sampler.sample()
    held = torch.empty(HOLD_GIB * GIB, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    stop = threading.Event()
    worker = threading.Thread(target=busy, args=(stop,), daemon=True)
    worker.start()
    time.sleep(3.0)  # NVML's utilisation is a share of its last sample period (about 1 s)
    loaded = []
    for _ in range(5):
        loaded.append(sampler.sample())
        time.sleep(0.5)
    stop.set()
    worker.join()
    del held
    torch.cuda.empty_cache()
    time.sleep(2.0)
    after = sampler.sample()
    state = sampler.state()
    sampler.close()
    found |= {
        "idle": [s.as_dict() for s in idle],
        "loaded": [[s.as_dict() for s in xs] for xs in loaded],
        "after": [s.as_dict() for s in after],
        "state": state,
    }
    problems = []
    if not idle or not all(loaded) or not after:
        problems.append(f"the sampler saw no GPU: {sampler.message}")
    else:
        used_idle = idle[0].memory_used_bytes
        used_loaded = max(xs[0].memory_used_bytes for xs in loaded)
        util_loaded = max(xs[0].utilization_pct for xs in loaded)
        found["summary"] = {
            "nvml_total_gib": idle[0].memory_total_bytes / GIB,
            "used_idle_gib": used_idle / GIB,
            "used_loaded_gib": used_loaded / GIB,
            "used_after_gib": after[0].memory_used_bytes / GIB,
            "util_idle_pct": idle[0].utilization_pct,
            "util_loaded_pct": util_loaded,
            "util_after_pct": after[0].utilization_pct,
        }
        if used_loaded - used_idle < (HOLD_GIB - 1) * GIB:
            problems.append(f"{HOLD_GIB} GiB taken, the sampler saw {used_loaded - used_idle} B")
        if util_loaded < 50:
            problems.append(f"a busy GPU read {util_loaded:g} % utilised")
        print(json.dumps(found["summary"], indent=2), flush=True)
    found["problems"] = problems
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(found, indent=2) + "\n", encoding="utf-8")
    for p in problems:
        print("PROBLEM:", p, flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
