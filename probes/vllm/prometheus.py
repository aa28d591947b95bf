"""A vLLM engine's series read from a Prometheus server that already scrapes it.

For teams whose Prometheus scrapes vLLM, a target may name that server and a label selector
instead of the engine: each interval the worker asks Prometheus (instant queries through
its HTTP API) for the engine's `vllm:` series and its `up`, and turns the answer into the
exposition text the engine itself would have served, so the same parser, name mapping
(both vLLM spellings) and store take it from there; every page, alert and diagnosis reads
it as it reads a scraped target. A range query fills the recent past when the target is
new.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from planner.errors import TargetError
from probes.vllm.metrics import CACHE_CONFIG, raw_base
from storage.schemas import SELECTOR_NAME

# The labels Prometheus puts on every series of a scrape target; not vLLM's own.
SCRAPE_LABELS = ("job", "instance")
QUERY = "/api/v1/query"
QUERY_RANGE = "/api/v1/query_range"
# At most this many points a series in a backfill (Prometheus refuses over 11,000).
MAX_RANGE_POINTS = 10_000


def _inner(selector: str) -> str:
    return selector.strip()[1:-1].strip().rstrip(",")


def _labels_of(selector: str) -> set[str]:
    return {m.group(1) for m in SELECTOR_NAME.finditer(_inner(selector))}


def queries(selector: str) -> tuple[str, str]:
    """The two queries: the engine's `vllm:` series, and Prometheus' `up` for it."""
    inner = _inner(selector)
    matchers = f",{inner}" if inner else ""
    return f'{{__name__=~"vllm:.+"{matchers}}}', f"up{selector if inner else ''}"


def query_url(base_url: str, expr: str, at: float | None = None) -> str:
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    return f"{base_url}{QUERY}?{urlencode(params)}"


def range_url(base_url: str, expr: str, start: float, end: float, step: float) -> str:
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    return f"{base_url}{QUERY_RANGE}?{urlencode(params)}"


def result(body: str, url: str) -> list[dict[str, Any]]:
    """The `result` of a query's JSON answer; Prometheus' own error, or a page that is not
    one of its answers, as a TargetError."""
    try:
        doc = json.loads(body)
    except ValueError as err:
        raise TargetError(
            f"{url} did not answer with Prometheus' JSON (is it a Prometheus?)"
        ) from err
    if not isinstance(doc, dict) or doc.get("status") != "success":
        why = doc.get("error", "no reason given") if isinstance(doc, dict) else "not an object"
        raise TargetError(f"Prometheus refused the query at {url}: {why}")
    data = doc.get("data") or {}
    found = data.get("result")
    if not isinstance(found, list):
        raise TargetError(f"{url} answered without a result list")
    return found


def _instances(up: list[dict[str, Any]], selector: str, server: str) -> dict[str, Any]:
    """The one scrape target `up` names; refused when none or several match."""
    if not up:
        raise TargetError(
            f"Prometheus at {server} has no `up` series for {selector}: check the selector "
            "(job, instance) and that Prometheus scrapes the engine"
        )
    if len(up) > 1:
        names = sorted(str(u["metric"].get("instance", "?")) for u in up)[:5]
        raise TargetError(
            f"the selector {selector} matches {len(up)} scrape targets in Prometheus "
            f'({", ".join(names)}, ...): narrow it to one engine, e.g. with instance="..."'
        )
    return up[0]


def _value(text: str) -> str:
    v = float(text)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(series: Iterable[tuple[dict[str, str], str]], drop: set[str]) -> str:
    """(labels with `__name__`, value) pairs as Prometheus exposition text, one family block
    per vLLM metric (histograms and counters typed as vLLM declares them), without the
    labels in `drop` (Prometheus' target labels)."""
    families: dict[str, tuple[str, list[str]]] = {}
    grouped: dict[str, list[str]] = defaultdict(list)
    for labels, value in series:
        name = labels.get("__name__", "")
        if not name.startswith("vllm:"):
            continue
        base, role = raw_base(name, "", "")
        kind = {"bucket": "histogram", "sum": "histogram", "count": "histogram"}.get(
            role, "counter" if role == "counter" else "gauge"
        )
        if name == CACHE_CONFIG:
            base, kind = name, "gauge"
        families.setdefault(base, (kind, []))
        kept = ",".join(
            f'{k}="{_escape(v)}"'
            for k, v in sorted(labels.items())
            if k != "__name__" and k not in drop
        )
        grouped[base].append(f"{name}{{{kept}}} {_value(value)}")
    out = []
    for base, (kind, _) in sorted(families.items()):
        out.append(f"# HELP {base} read from Prometheus\n# TYPE {base} {kind}\n")
        out.append("\n".join(grouped[base]) + "\n")
    return "".join(out)


def instant_text(
    up: list[dict[str, Any]], vllm: list[dict[str, Any]], selector: str, server: str
) -> str:
    """The engine's page as Prometheus saw it last, from the two instant queries' results;
    a TargetError when Prometheus could not scrape it or holds none of its series."""
    target = _instances(up, selector, server)
    instance = target["metric"].get("instance", selector)
    if float(target["value"][1]) != 1.0:
        raise TargetError(
            f"Prometheus at {server} could not scrape {instance} at its last try (up = 0)"
        )
    if not vllm:
        raise TargetError(
            f"Prometheus at {server} scrapes {instance} but holds no vllm: series for it: "
            "is it a vLLM engine?"
        )
    drop = set(SCRAPE_LABELS) | _labels_of(selector)
    return exposition(((s["metric"], s["value"][1]) for s in vllm), drop)


def range_texts(
    up: list[dict[str, Any]], vllm: list[dict[str, Any]], selector: str, server: str
) -> list[tuple[float, str]]:
    """Pages at each step of two range queries' results (matrices), oldest first, for the
    steps where Prometheus had scraped the engine."""
    if not up:
        return []
    _instances([{"metric": u["metric"], "value": [0, "1"]} for u in up], selector, server)
    scraped = {float(t) for t, v in up[0]["values"] if float(v) == 1.0}
    drop = set(SCRAPE_LABELS) | _labels_of(selector)
    at: dict[float, list[tuple[dict[str, str], str]]] = defaultdict(list)
    for s in vllm:
        for t, v in s["values"]:
            if float(t) in scraped:
                at[float(t)].append((s["metric"], v))
    return [(t, exposition(rows, drop)) for t, rows in sorted(at.items())]
