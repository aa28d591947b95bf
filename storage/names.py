"""Canonical metric vocabulary: the names kvscope stores, whatever vLLM version exposed them.

The scraper (`probes/vllm/metrics.py`) maps every known vLLM spelling onto these names; storage,
derivations and pages only ever speak canonical. Counters keep Prometheus' `_total` suffix;
a histogram `h` is stored as `h_bucket` (label `le`), `h_sum` and `h_count`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What a canonical metric is, which decides how it is stored and derived."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Metric:
    """One canonical metric: how to store it, combine label sets, and show it."""

    name: str
    kind: Kind
    title: str
    unit: str = ""
    # How series of different label sets (engines, reasons) combine into one line.
    combine: str = "sum"  # sum | mean


_ALL = [
    Metric("kv_usage", Kind.GAUGE, "KV cache usage", "fraction", combine="mean"),
    Metric("running", Kind.GAUGE, "Running requests", "requests"),
    Metric("waiting", Kind.GAUGE, "Waiting requests", "requests"),
    Metric("waiting_by_reason", Kind.GAUGE, "Waiting requests by reason", "requests"),
    Metric("swapped", Kind.GAUGE, "Swapped requests (V0)", "requests"),
    Metric("cpu_kv_usage", Kind.GAUGE, "CPU swap cache usage (V0)", "fraction", "mean"),
    Metric("preemptions_total", Kind.COUNTER, "Preemptions", "preemptions"),
    Metric("prompt_tokens_total", Kind.COUNTER, "Prompt tokens", "tokens"),
    Metric("generation_tokens_total", Kind.COUNTER, "Generation tokens", "tokens"),
    Metric("prefix_cache_queries_total", Kind.COUNTER, "Prefix cache queries", "tokens"),
    Metric("prefix_cache_hits_total", Kind.COUNTER, "Prefix cache hits", "tokens"),
    Metric("requests_finished_total", Kind.COUNTER, "Finished requests", "requests"),
    Metric("ttft", Kind.HISTOGRAM, "Time to first token", "s"),
    Metric("itl", Kind.HISTOGRAM, "Inter-token latency", "s"),
    Metric("tpot", Kind.HISTOGRAM, "Time per output token", "s"),
    Metric("e2e", Kind.HISTOGRAM, "End-to-end latency", "s"),
    Metric("queue_time", Kind.HISTOGRAM, "Queue time", "s"),
    Metric("prefill_time", Kind.HISTOGRAM, "Prefill time", "s"),
    Metric("decode_time", Kind.HISTOGRAM, "Decode time", "s"),
    Metric("inference_time", Kind.HISTOGRAM, "Inference time", "s"),
    Metric("iteration_tokens", Kind.HISTOGRAM, "Tokens per engine step", "tokens"),
    Metric("prompt_len", Kind.HISTOGRAM, "Prompt length", "tokens"),
    Metric("output_len", Kind.HISTOGRAM, "Output length", "tokens"),
]

METRICS: dict[str, Metric] = {m.name: m for m in _ALL}

# The tail the Tail page and the scrape summary report, in display order.
LATENCY_HISTOGRAMS: tuple[str, ...] = ("ttft", "itl", "tpot", "e2e", "queue_time")

QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
