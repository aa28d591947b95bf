"""Load for the probes: the asyncio hot path.

generator (open loop, every request at its scheduled time; closed loop, a fixed number in
flight; per-request records and their summary; requests go through the lean transport in
`probes.vllm.transport`), workloads (prompts built to an exact token count with the
engine's tokenizer, for the profiles and arrival processes of `planner.workload`).
May import `planner` and `probes.vllm`.
"""

from planner.workload import PRESETS, Arrival, Profile, RequestShape, parse_profile
from probes.load.generator import (
    Bounds,
    Percentiles,
    RequestResult,
    RequestSpec,
    RunResult,
    Summary,
    new_client,
    run_closed_loop,
    run_open_loop,
)
from probes.load.workloads import PromptBuilder

__all__ = [
    "PRESETS",
    "Arrival",
    "Bounds",
    "Percentiles",
    "Profile",
    "PromptBuilder",
    "RequestResult",
    "RequestShape",
    "RequestSpec",
    "RunResult",
    "Summary",
    "new_client",
    "parse_profile",
    "run_closed_loop",
    "run_open_loop",
]
