"""Parse a vLLM metrics page and map every known spelling to kvscope's canonical names.

Parsing is `prometheus_client.parser`, block by block (one `# HELP` family each), so one
corrupt family costs that family, not the scrape. Spellings are listed newest first; when
an engine exposes two spellings of one metric (during a deprecation), the newest wins.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from planner.errors import NotPrometheusText, TargetError
from planner.stats import histogram_quantile
from storage.names import LATENCY_HISTOGRAMS, METRICS, QUANTILES, Kind

# canonical base name -> raw vLLM base names (no `_total`, no `_bucket`), newest first.
SPELLINGS: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "waiting_by_reason": ("vllm:num_requests_waiting_by_reason",),
    "swapped": ("vllm:num_requests_swapped",),
    "cpu_kv_usage": ("vllm:cpu_cache_usage_perc",),
    "preemptions_total": ("vllm:num_preemptions",),
    "prompt_tokens_total": ("vllm:prompt_tokens",),
    "generation_tokens_total": ("vllm:generation_tokens",),
    "prefix_cache_queries_total": (
        "vllm:prefix_cache_queries",
        "vllm:gpu_prefix_cache_queries",
    ),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "requests_finished_total": ("vllm:request_success",),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue_time": ("vllm:request_queue_time_seconds",),
    "prefill_time": ("vllm:request_prefill_time_seconds",),
    "decode_time": ("vllm:request_decode_time_seconds",),
    "inference_time": ("vllm:request_inference_time_seconds",),
    # A histogram despite the suffix, so `_total` is part of its base name.
    "iteration_tokens": ("vllm:iteration_tokens_total",),
    "prompt_len": ("vllm:request_prompt_tokens",),
    "output_len": ("vllm:request_generation_tokens",),
}

CACHE_CONFIG = "vllm:cache_config_info"
# Labels that describe the engine rather than the series; kept on the target instead.
TARGET_LABELS = ("model_name",)

_RAW_TO_CANONICAL: dict[str, str] = {
    raw: canon for canon, raws in SPELLINGS.items() for raw in raws
}


@dataclass(frozen=True)
class ParsedSample:
    """One sample under its canonical series name (`ttft_bucket`, `kv_usage`, ...)."""

    series: str
    metric: str  # canonical metric (`ttft` for `ttft_bucket`)
    labels: dict[str, str]
    value: float
    raw_name: str
    kind: str  # gauge | counter | bucket | sum | count

    @cached_property
    def labels_tuple(self) -> tuple[tuple[str, str], ...]:
        """The labels, sorted, as a tuple: a series' identity, hashable (kept once computed:
        a sample of an unchanged family is the same object scrape after scrape)."""
        return tuple(sorted(self.labels.items()))

    @property
    def labels_key(self) -> str:
        """Canonical JSON of the labels: a series' identity together with its name."""
        return json.dumps(self.labels, sort_keys=True, separators=(",", ":"))


@dataclass
class ParsedScrape:
    """Everything kvscope keeps from one metrics page."""

    samples: list[ParsedSample] = field(default_factory=list)
    cache_info: dict[str, str] = field(default_factory=dict)
    model_name: str | None = None
    warnings: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)


def _blocks(text: str) -> list[str]:
    """Split exposition text into family blocks at each `# HELP` line (a string split:
    this runs on every page of every target)."""
    text = text.replace("\r\n", "\n")
    parts = text.split("\n# HELP ")
    blocks = [parts[0], *("# HELP " + p for p in parts[1:])]
    return [b if b.endswith("\n") else b + "\n" for b in blocks if b.strip()]


def raw_base(sample_name: str, family_type: str, family_name: str) -> tuple[str, str]:
    """(raw base name, sample role) for a sample, whatever its TYPE line said."""
    for suffix in ("_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix):
            base = sample_name[: -len(suffix)]
            canon = _RAW_TO_CANONICAL.get(base)
            if canon and METRICS[canon].kind is Kind.HISTOGRAM:
                return base, suffix[1:]
    if sample_name.endswith("_total"):
        base = sample_name[: -len("_total")]
        if base in _RAW_TO_CANONICAL:
            return base, "counter"
    if family_type == "counter" and sample_name == family_name:
        return sample_name, "counter"
    return sample_name, "gauge"


def _family(block: str) -> str | None:
    """The family a block's `# HELP` line names, if it starts with one."""
    if not block.startswith("# HELP "):
        return None
    parts = block.split(None, 3)
    return parts[2] if len(parts) > 2 else None


def _wanted(name: str) -> bool:
    """Whether kvscope keeps anything of a family: a mapped vLLM metric, or the cache config."""
    if name == CACHE_CONFIG:
        return True
    for suffix in ("", "_total", "_created"):
        if suffix and not name.endswith(suffix):
            continue
        if name.removesuffix(suffix) in _RAW_TO_CANONICAL:
            return not suffix or suffix == "_total"
    return False


@dataclass
class _Digest:
    """What one family block yields, kept per block text: an unchanged block (most of them,
    on an idle engine) costs a dictionary look-up on the next page, not a parse."""

    rows: list[tuple[str, str, ParsedSample]] = field(default_factory=list)  # canon, base
    cache_info: dict[str, str] | None = None
    model_name: str | None = None
    unmapped: list[str] = field(default_factory=list)
    nan_count: int = 0
    parsed: bool = False
    bad: str | None = None


def _digest(block: str, label_limit: int | None, value_limit: int | None) -> _Digest:
    out = _Digest()
    try:
        families = list(text_string_to_metric_families(block))
    except (ValueError, IndexError, TypeError) as err:
        out.bad = f"{block.splitlines()[0][:80]!r} ({err})"
        return out
    out.parsed = bool(families)
    for fam in families:
        for s in fam.samples:
            _check_labels(s.name, s.labels, label_limit, value_limit)
            if s.name.endswith("_created"):
                continue
            if s.name == CACHE_CONFIG:
                out.cache_info = {k: v for k, v in s.labels.items() if k != "model_name"}
                out.model_name = out.model_name or s.labels.get("model_name")
                continue
            base, role = raw_base(s.name, fam.type, fam.name)
            canon = _RAW_TO_CANONICAL.get(base)
            if canon is None:
                if s.name.startswith("vllm:") and s.name not in out.unmapped:
                    out.unmapped.append(s.name)
                continue
            if math.isnan(s.value) or (math.isinf(s.value) and role == "gauge"):
                out.nan_count += 1
                continue
            out.model_name = out.model_name or s.labels.get("model_name")
            kind = METRICS[canon].kind
            if kind is Kind.HISTOGRAM:
                if role == "gauge":  # the bare family name of a histogram is no sample
                    continue
                series = f"{canon}_{role}"
            else:
                series, role = canon, kind.value
            labels = {k: v for k, v in s.labels.items() if k not in TARGET_LABELS}
            sample = ParsedSample(series, canon, labels, float(s.value), s.name, role)
            out.rows.append((canon, base, sample))
    return out


def parse_metrics(
    text: str,
    *,
    label_limit: int | None = None,
    label_value_length_limit: int | None = None,
    cache: dict[str, Any] | None = None,
) -> ParsedScrape:
    """Parse a metrics page; raise NotPrometheusText when nothing in it is Prometheus text,
    TargetError when a sample has more labels, or a longer label value, than allowed.

    Families kvscope does not keep (the HTTP server's, vLLM's unmapped ones) are named, not
    parsed. With `cache` (one per target, under the same limits), a family block unchanged
    since the last page is not parsed again. The cache is left holding this page's blocks.
    """
    stripped = text.lstrip()
    if not stripped:
        raise NotPrometheusText("the response body is empty")
    if stripped.startswith("<"):
        raise NotPrometheusText("the response is an HTML/XML page, not Prometheus metrics text")
    if stripped.startswith(("{", "[")):
        raise NotPrometheusText("the response is JSON, not Prometheus metrics text")

    out = ParsedScrape()
    rows: list[tuple[str, str, ParsedSample]] = []
    parsed_any = False
    bad_blocks: list[str] = []
    nan_count = 0
    seen: dict[str, Any] = {}
    for block in _blocks(text):
        name = _family(block)
        if name is not None and not _wanted(name):
            parsed_any = True  # a well-formed family, just not one kvscope keeps
            if name.startswith("vllm:") and not name.endswith("_created"):
                out.unmapped.append(name)
            continue
        digest = cache.get(block) if cache is not None else None
        if digest is None:
            digest = _digest(block, label_limit, label_value_length_limit)
        seen[block] = digest
        if digest.bad is not None:
            bad_blocks.append(digest.bad)
            continue
        parsed_any = parsed_any or digest.parsed
        rows += digest.rows
        nan_count += digest.nan_count
        out.unmapped += [u for u in digest.unmapped if u not in out.unmapped]
        if digest.cache_info is not None:
            out.cache_info = digest.cache_info
        out.model_name = out.model_name or digest.model_name

    if cache is not None:
        cache.clear()
        cache.update(seen)
    if not parsed_any:
        detail = bad_blocks[0] if bad_blocks else "no metric lines"
        raise NotPrometheusText(f"the response is not Prometheus metrics text: {detail}")
    if bad_blocks:
        out.warnings.append(
            f"{len(bad_blocks)} malformed metric famil{'y' if len(bad_blocks) == 1 else 'ies'} "
            f"skipped, first: {bad_blocks[0]}"
        )
    if nan_count:
        out.warnings.append(f"{nan_count} NaN/Inf value(s) skipped")
    # Newest spelling present wins; older ones are duplicates during a deprecation.
    present: dict[str, set[str]] = {}
    for canon, base, _ in rows:
        present.setdefault(canon, set()).add(base)
    chosen = {
        canon: next(raw for raw in SPELLINGS[canon] if raw in bases)
        for canon, bases in present.items()
    }
    out.samples = [sample for canon, base, sample in rows if base == chosen[canon]]
    return out


def _check_labels(
    name: str, labels: dict[str, str], limit: int | None, value_limit: int | None
) -> None:
    if limit is not None and len(labels) > limit:
        raise TargetError(f"{name[:100]} has {len(labels)} labels, over the label limit of {limit}")
    if value_limit is not None:
        for key, value in labels.items():
            if len(value) > value_limit:
                raise TargetError(
                    f"{name[:100]} has a {key[:100]} label of {len(value):,} characters, over "
                    f"the label value length limit of {value_limit:,}"
                )


def summarize(scrape: ParsedScrape) -> dict[str, Any]:
    """Canonical values of one scrape, as `kvscope scrape --once --json` prints them.

    Label sets (engines, reasons) are combined per metric; latency histograms report their
    count and p50/p95/p99 since engine start.
    """
    values: dict[str, list[float]] = {}
    buckets: dict[str, dict[float, float]] = {}
    counts: dict[str, float] = {}
    for s in scrape.samples:
        if s.kind == "bucket":
            le = float(s.labels["le"])
            per = buckets.setdefault(s.metric, {})
            per[le] = per.get(le, 0.0) + s.value
        elif s.kind == "count":
            counts[s.metric] = counts.get(s.metric, 0.0) + s.value
        elif s.kind in ("gauge", "counter"):
            values.setdefault(s.series, []).append(s.value)

    out: dict[str, Any] = {}
    for name, vals in values.items():
        if METRICS[name].combine == "mean":
            out[name] = sum(vals) / len(vals)
        else:
            out[name] = sum(vals)
    for name in (
        "kv_usage",
        "running",
        "waiting",
        "preemptions_total",
        "prompt_tokens_total",
        "generation_tokens_total",
    ):
        out.setdefault(name, None)
    info = scrape.cache_info
    out["num_gpu_blocks"] = _int_or_none(info.get("num_gpu_blocks"))
    out["block_size"] = _int_or_none(info.get("block_size"))
    out["cache_dtype"] = info.get("cache_dtype")
    out["model_name"] = scrape.model_name
    for name in (*LATENCY_HISTOGRAMS, *(h for h in buckets if h not in LATENCY_HISTOGRAMS)):
        if name not in buckets:
            continue
        pairs = sorted(buckets[name].items())
        entry: dict[str, float | int | None] = {"count": int(counts.get(name, pairs[-1][1]))}
        for q in QUANTILES:
            v = histogram_quantile(q, pairs)
            entry[f"p{round(q * 100)}"] = None if math.isnan(v) else v
        out[name] = entry
    if scrape.warnings:
        out["warnings"] = scrape.warnings
    return out


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None
