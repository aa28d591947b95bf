"""Load for the probes: the asyncio hot path.

generator (open loop, every request at its scheduled time; closed loop, a fixed number in
flight; per-request records and their summary; requests go through the lean transport in
`probes.vllm.transport`), workloads (profiles of prompt and
answer lengths, and prompts built to an exact token count with the engine's tokenizer).
May import `planner` and `probes.vllm`.
"""

from probes.load.generator import (
    Arrival,
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
from probes.load.workloads import PRESETS, Profile, PromptBuilder, RequestShape, parse_profile

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
