"""The worker: the long-lived process that scrapes targets, carries out requested work and
supervises managed engines. Holds the scheduler wiring, target scraping, the engine registry,
the work queue, GPU sampling and the demo load, composed by `Worker`. May import everything
in `probes`, and `storage` and `planner`; nothing in `probes` imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probes.worker.demo import DemoLoad
    from probes.worker.engines import EngineRegistry
    from probes.worker.gpu import GpuSampler
    from probes.worker.scheduler import WorkerJobs
    from probes.worker.scraping import TargetScraper
    from probes.worker.service import Worker
    from probes.worker.work import BUILTIN_HANDLERS, Handler, RunCancelled, WorkQueue

# Names are loaded when first used, so importing one submodule stays light.
_WHERE: dict[str, str] = {
    "BUILTIN_HANDLERS": "probes.worker.work",
    "DemoLoad": "probes.worker.demo",
    "EngineRegistry": "probes.worker.engines",
    "GpuSampler": "probes.worker.gpu",
    "Handler": "probes.worker.work",
    "RunCancelled": "probes.worker.work",
    "TargetScraper": "probes.worker.scraping",
    "WorkQueue": "probes.worker.work",
    "Worker": "probes.worker.service",
    "WorkerJobs": "probes.worker.scheduler",
}
__all__ = [
    "BUILTIN_HANDLERS",
    "DemoLoad",
    "EngineRegistry",
    "GpuSampler",
    "Handler",
    "RunCancelled",
    "TargetScraper",
    "WorkQueue",
    "Worker",
    "WorkerJobs",
]


def __getattr__(name: str) -> Any:
    """A public name of the package, imported from its module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
