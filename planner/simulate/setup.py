"""A what-if scenario from the names people already use: the engine spec's settings
(`kv_cache_dtype`, `max_num_seqs`, ...) and the latency probe's workload parameters
(`prompt_tokens`, `output_tokens`, `num_requests`, `arrival`, ...), validated in one place
for the CLI's `--set k=v` and the What-if page. The KV block count comes from the planner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.capacity import CapacityPlan, PlanRequest, plan_capacity
from planner.errors import InvalidInput, validation_message
from planner.gpus import GPUSpec
from planner.models import ModelArch
from planner.simulate.calibrate import Calibration
from planner.simulate.engine import EngineConfig
from planner.simulate.roofline import roofline_cost
from planner.simulate.whatif import MAX_REQUESTS, Scenario, SloBounds
from planner.workload import FixedProfile, Profile, parse_profile


class Settings(BaseModel):
    """Engine settings (the engine spec's names) and workload parameters (the latency
    probe's names) a what-if run takes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The engine.
    kv_cache_dtype: str = "auto"
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=16)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=16)
    block_size: int | None = Field(None, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    vllm_version: str | None = None
    num_gpu_blocks_override: int | None = Field(None, ge=2)
    # The traffic.
    prompt_tokens: int | None = Field(None, ge=1)
    output_tokens: int | None = Field(None, ge=1)
    num_requests: int = Field(2000, ge=1, le=MAX_REQUESTS)
    # Seconds of arrivals instead of a count, as the latency probe's duration_s.
    duration_s: float | None = Field(None, gt=0, le=24 * 3600)
    arrival: Literal["poisson", "gamma", "constant"] = "poisson"
    cv: float = Field(1.0, gt=0, le=20)

    @model_validator(mode="after")
    def _one_length(self) -> Settings:
        if self.duration_s is not None and "num_requests" in self.model_fields_set:
            raise ValueError("give num_requests or duration_s, not both")
        return self


SETTING_NAMES = tuple(Settings.model_fields)


def parse_settings(pairs: Iterable[str] = (), base: Mapping[str, Any] | None = None) -> Settings:
    """`k=v` pairs (the CLI's --set) over `base`, validated; a clear error names the key."""
    data: dict[str, Any] = dict(base or {})
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InvalidInput(f"--set takes key=value, got {pair!r}")
        if key not in Settings.model_fields:
            raise InvalidInput(f"unknown setting {key!r}; known: {', '.join(SETTING_NAMES)}")
        data[key] = value.strip()
    try:
        return Settings.model_validate(data)
    except ValidationError as err:
        raise InvalidInput(f"invalid what-if settings: {validation_message(err)}") from err


def workload(settings: Settings, profile: str | Mapping[str, Any] | None) -> Profile:
    """The profile, or fixed lengths from `prompt_tokens`/`output_tokens` (512/128 when
    neither is given); not both, as the latency probe."""
    fixed = settings.prompt_tokens is not None or settings.output_tokens is not None
    if profile is not None and fixed:
        raise InvalidInput("give a profile or prompt_tokens/output_tokens, not both")
    if profile is not None:
        return parse_profile(profile)
    return FixedProfile(
        prompt_tokens=settings.prompt_tokens or 512, output_tokens=settings.output_tokens or 128
    )


def plan_for(model: ModelArch, gpu: GPUSpec, settings: Settings) -> CapacityPlan:
    """The planner's plan of one replica with these settings (its block count and limits)."""
    tp = settings.tensor_parallel_size
    return plan_capacity(
        PlanRequest(
            model=model,
            gpu=gpu,
            num_gpus=tp,
            tp=tp,
            kv_dtype=settings.kv_cache_dtype,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            block_size=settings.block_size,
            max_model_len=settings.max_model_len,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs,
            vllm_version=settings.vllm_version,
        )
    )


def scenario(
    model: ModelArch,
    gpu: GPUSpec,
    settings: Settings,
    profile: str | Mapping[str, Any] | None = None,
    slo: SloBounds | None = None,
) -> tuple[Scenario, CapacityPlan]:
    """The scenario to simulate and the plan its blocks come from (roofline step cost)."""
    plan = plan_for(model, gpu, settings)
    if plan.usable_blocks < 1:
        why = "; ".join(plan.notes) or "the weights and overheads fill the memory"
        raise InvalidInput(
            f"{model.name} leaves no KV cache on {settings.tensor_parallel_size} x {gpu.name}: "
            f"{why} (see kvscope plan)"
        )
    blocks = plan.usable_blocks
    if settings.num_gpu_blocks_override is not None:
        blocks = settings.num_gpu_blocks_override - 1  # vLLM's null block
    batched = plan.max_num_batched_tokens
    if not settings.enable_chunked_prefill:
        # vLLM raises the budget to max_model_len without chunked prefill.
        batched = max(batched, plan.max_model_len)
    config = EngineConfig(
        num_blocks=blocks,
        block_size=plan.block_size,
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=batched,
        chunked_prefill=settings.enable_chunked_prefill,
        prefix_caching=settings.enable_prefix_caching,
        max_model_len=plan.max_model_len,
        long_prefill_token_threshold=settings.long_prefill_token_threshold,
    )
    return (
        Scenario(
            config=config,
            cost=roofline_cost(plan),
            profile=workload(settings, profile),
            requests=settings.num_requests,
            arrival=settings.arrival,
            cv=settings.cv,
            slo=slo,
            source="roofline",
            duration_s=settings.duration_s,
        ),
        plan,
    )


# Second settings to set beside the first: what changes, and how many replicas share the
# traffic (one more GPU serving a second replica halves each one's rate).
VARIANTS: dict[str, tuple[dict[str, Any], int]] = {
    "chunked prefill off": ({"enable_chunked_prefill": False}, 1),
    "FP8 KV cache": ({"kv_cache_dtype": "fp8"}, 1),
    "one more GPU (two replicas)": ({}, 2),
}


def variant(settings: Settings, name: str) -> tuple[Settings, int]:
    """The settings of a named variant and the replicas that share the traffic."""
    try:
        update, replicas = VARIANTS[name]
    except KeyError:
        raise InvalidInput(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}") from None
    return settings.model_copy(update=update), replicas


# What a calibrated engine's --set may change: its scheduling, and its block count. The rest
# (dtype, memory, parallelism) changes the step cost the calibration measured.
SCHEDULING = {
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_chunked_prefill": "chunked_prefill",
    "enable_prefix_caching": "prefix_caching",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    "max_model_len": "max_model_len",
}
TRAFFIC = {"prompt_tokens", "output_tokens", "num_requests", "duration_s", "arrival", "cv"}


def calibrated_scenario(
    calibration: Calibration,
    settings: Settings,
    profile: str | Mapping[str, Any] | None = None,
    slo: SloBounds | None = None,
    now: float | None = None,
) -> Scenario:
    """The scenario of an engine kvscope calibrated: its fitted step cost and its settings,
    with scheduling limits and the block count changed where `settings` sets them; `now`
    puts the calibration's age in the source."""
    given = settings.model_fields_set
    fixed = given - set(SCHEDULING) - TRAFFIC - {"num_gpu_blocks_override"}
    if fixed:
        raise InvalidInput(
            f"a calibrated engine's {', '.join(sorted(fixed))} cannot change: the step cost "
            "was measured with them; calibrate an engine that runs with the new values"
        )
    engine = dict(calibration.engine)
    for name, field in SCHEDULING.items():
        if name in given:
            engine[field] = getattr(settings, name)
    if settings.num_gpu_blocks_override is not None:
        engine["num_blocks"] = settings.num_gpu_blocks_override - 1
    if not engine["chunked_prefill"]:
        engine["max_num_batched_tokens"] = max(
            int(engine["max_num_batched_tokens"]), int(engine["max_model_len"])
        )
    chosen = Scenario(
        config=EngineConfig(**engine),  # type: ignore[arg-type]
        cost=calibration.cost(),  # (Scenario needs one; `measured_by` sets it)
        profile=workload(settings, profile),
        requests=settings.num_requests,
        arrival=settings.arrival,
        cv=settings.cv,
        slo=slo,
        source=calibration.describe(now),
        duration_s=settings.duration_s,
        calibrated_prompt=calibration.max_prompt,
        calibrated_batch=calibration.max_batch,
    )
    return measured_by(chosen, calibration)


def measured_by(scenario: Scenario, calibration: Calibration) -> Scenario:
    """`scenario` with what `calibration` measured of its engine: the step cost (at the
    scale its checks since the tune ran, `Calibration.checked_scale`), the API's time, the
    fit error, the host's noise and speed, the TPOT spread where the queue stood, the
    drifts of the runs checked since the tune against that scale (checks from before a
    retune measured another cost), and later runs' host noise, whatever the cost (one
    place, for `calibrated_scenario` and the benchmarks)."""
    scale = calibration.checked_scale()
    return replace(
        scenario,
        cost=calibration.cost().scaled(scale),
        api_s=calibration.request_s,
        residuals=(calibration.residual_low, calibration.residual_high),
        noise=tuple(calibration.noise),
        queued_tpot=tuple(calibration.queued_tpot),
        speed=tuple(calibration.speed),
        drifts=tuple(c.drift / scale for c in calibration.checks_since_tune()),
        noise_pools=tuple(tuple(c.noise) for c in calibration.checks if c.noise),
    )
