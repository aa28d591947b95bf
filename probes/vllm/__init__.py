"""The only code that speaks to a vLLM engine, and what it says back.

client (`VllmClient`, `AsyncVllmClient`, `Target`, `Endpoint`: every engine path, the
bearer token, limits and error messages), transport (a lean HTTP/1.1 transport for
httpx: thousands of requests a second on one core, and scrapes without httpcore's per-call
overhead), metrics (the metrics page parsed and every known
spelling mapped to kvscope's canonical names), logparse (startup and error lines of the
engine's log turned into facts). May import `planner` and `storage` (names, schemas).
"""

from probes.vllm.client import AsyncVllmClient, Endpoint, Target, VllmClient
from probes.vllm.logparse import LogFact, LogParser
from probes.vllm.metrics import SPELLINGS, ParsedSample, ParsedScrape, parse_metrics, summarize

__all__ = [
    "SPELLINGS",
    "AsyncVllmClient",
    "Endpoint",
    "LogFact",
    "LogParser",
    "ParsedSample",
    "ParsedScrape",
    "Target",
    "VllmClient",
    "parse_metrics",
    "summarize",
]
