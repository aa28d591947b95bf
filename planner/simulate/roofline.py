"""Step cost from first principles: bytes read against memory bandwidth, FLOPs against
peak, plus a fixed per-step overhead. Uncalibrated: the efficiencies below are the usual
assumptions for decode-bound serving, not measurements; a calibrated `StepCost` (fitted to
an engine's measured steps) replaces this where kvscope can reach an engine.
"""

from __future__ import annotations

from planner.capacity import CapacityPlan
from planner.errors import InvalidInput
from planner.simulate.engine import StepCost

# Assumed shares of the datasheet figures a serving step reaches, and the scheduler's and
# kernel launches' fixed cost per step. Stated, not measured: the What-if page labels
# roofline predictions as such.
MEMORY_EFFICIENCY = 0.8
COMPUTE_EFFICIENCY = 0.5
STEP_OVERHEAD_S = 0.003
# Its error where it was measured (benchmarks/roofline_gpu.py; docs/simulator.md): the
# model's forward pass alone, so what vLLM adds around it (scheduling, sampling,
# streaming) is not in the measured side.
MEASURED_ERROR = (
    "on an H200 against the forward pass alone (PyTorch with CUDA graphs, not vLLM; "
    "Llama-3.1-8B and Phi-4): decode steps -5 % to +21 %, prefills +11 % to +26 %, "
    "chunked-prefill steps +12 % to +23 %"
)


def describe() -> str:
    """What a roofline prediction says of its step cost: the assumed efficiencies and the
    error measured where it was."""
    return (
        f"uncalibrated: {MEMORY_EFFICIENCY:.0%} of the memory bandwidth, "
        f"{COMPUTE_EFFICIENCY:.0%} of the BF16 peak, {STEP_OVERHEAD_S * 1000:g} ms a step, "
        f"assumed; measured {MEASURED_ERROR}"
    )


def roofline_cost(plan: CapacityPlan) -> StepCost:
    """The step cost of one replica of `plan` on its GPU (per-GPU shares under TP)."""
    gpu = plan.request.gpu
    if gpu is None or not gpu.bandwidth_gbs or not gpu.bf16_tflops:
        raise InvalidInput(
            "a roofline needs a catalog GPU with memory bandwidth and BF16 TFLOP/s; a CPU "
            "engine or a custom GPU needs a calibrated step cost"
        )
    bandwidth = gpu.bandwidth_gbs * 1e9 * MEMORY_EFFICIENCY
    flops = gpu.bf16_tflops * 1e12 * COMPUTE_EFFICIENCY
    per_gpu = plan.tp * plan.pp
    return StepCost(
        overhead_s=STEP_OVERHEAD_S,
        weights_read_s=plan.weights_bytes_per_gpu / bandwidth,
        kv_token_read_s=plan.kv_bytes_per_token_per_gpu / bandwidth,
        token_compute_s=2 * plan.active_params / per_gpu / flops,
    )
