"""What-if: vLLM V1's scheduler in simulated time (`engine`), step costs (`roofline`)."""

from planner.simulate.engine import (
    EngineConfig,
    EngineStats,
    RequestResult,
    SimRequest,
    StepCost,
    simulate,
)
from planner.simulate.roofline import roofline_cost

__all__ = [
    "EngineConfig",
    "EngineStats",
    "RequestResult",
    "SimRequest",
    "StepCost",
    "roofline_cost",
    "simulate",
]
