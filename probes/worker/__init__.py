"""The worker: the long-lived process that scrapes targets, carries out requested work and
supervises managed engines. Holds the scheduler wiring, target scraping, the engine registry,
the work queue, GPU sampling and the demo load, composed by `Worker`. May import everything
in `probes`, and `storage` and `planner`; nothing in `probes` imports it.
"""

from probes.worker.demo import DemoLoad
from probes.worker.engines import EngineRegistry
from probes.worker.gpu import GpuSampler
from probes.worker.scheduler import WorkerJobs
from probes.worker.scraping import TargetScraper
from probes.worker.service import Worker
from probes.worker.work import BUILTIN_HANDLERS, Handler, RunCancelled, WorkQueue

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
