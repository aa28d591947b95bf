"""Turn vLLM log lines into facts worth an event: KV capacity, memory, OOM, tracebacks.

Patterns cover V1 (0.9-0.32, GPU and CPU wording, numbers with thousands separators, the
two startup lines that newer releases print as one) and V0. A `LogParser` keeps the state
a traceback needs (it spans lines) and the last lines for crash reports.
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

_NUM = r"([\d,]+(?:\.\d+)?)"
# vLLM prefixes each line with "(Process pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] ".
_PREFIX = re.compile(
    r"^(?:\((?P<proc>[\w-]+) pid=\d+\)\s+)?(?:\([\w-]+ pid=\d+(?:, ip=[\d.]+)?\)\s+)?"
    r"(?:(?P<level>[A-Z]+)\s+\d\d-\d\d [\d:]+\s+\[[^\]]+\]\s+)?"
)


def _number(text: str | None) -> float | None:
    return None if text is None else float(text.replace(",", ""))


def _nums(*names: str) -> Callable[[re.Match[str]], dict[str, Any]]:
    """Values named by position: the match's groups as numbers."""

    def values(m: re.Match[str]) -> dict[str, Any]:
        return {name: _number(g) for name, g in zip(names, m.groups(), strict=False)}

    return values


def _capacity(m: re.Match[str]) -> dict[str, Any]:
    return {"device": m.group("device"), "tokens": _number(m.group(2))}


def _oom(m: re.Match[str]) -> dict[str, Any]:
    groups = m.groups()
    if not groups:
        return {}
    return {
        "max_seq_len": _number(groups[0]),
        "estimated_max_model_len": _number(groups[1]) if len(groups) > 1 else None,
    }


def _graph_util(m: re.Match[str]) -> dict[str, Any]:
    # 0.21+: "--gpu-memory-utilization=A is equivalent to B without CUDA graph profiling":
    # the estimate, as a share of total memory, came out of the KV budget.
    return {"util": _number(m.group(1)), "util_without_graphs": _number(m.group(2))}


_PROFILE_ITEMS = {
    "non_kv_gib": r"Total non KV cache memory: {n}",
    "torch_peak_gib": r"torch peak memory increase: {n}",
    "non_torch_gib": r"non-torch forward increase memory: {n}",
    "consumed_gib": r"total consumed \(from mem_get_info\): {n}",
    "weights_gib": r"weights memory: {n}",
}


def _profile(m: re.Match[str]) -> dict[str, Any]:
    """V1's profiling summary (a DEBUG line): its items vary by release."""
    out: dict[str, Any] = {}
    for key, item in _PROFILE_ITEMS.items():
        found = re.search(item.format(n=_NUM) + r" ?GiB", m.group(1))
        if found:
            out[key] = _number(found.group(1))
    return out


def _v0_breakdown(m: re.Match[str]) -> dict[str, Any]:
    return {
        "weights_gib": _number(m.group(1)),
        "non_torch_gib": _number(m.group(2)),
        "activation_gib": _number(m.group(3)),
        "kv_gib": _number(m.group(4)),
    }


_CONFIG_ITEMS = {
    "model": r"\bmodel='([^']*)'",
    "dtype": r"\bdtype=(?:torch\.)?(\w+)",
    "max_model_len": r"\bmax_seq_len=(\d+)",
    "tensor_parallel_size": r"\btensor_parallel_size=(\d+)",
    "pipeline_parallel_size": r"\bpipeline_parallel_size=(\d+)",
    "quantization": r"\bquantization=(\w+)",
    "enforce_eager": r"\benforce_eager=(True|False)",
    "kv_cache_dtype": r"\bkv_cache_dtype=(\w+)",
}


def _config(m: re.Match[str]) -> dict[str, Any]:
    """The engine's config line: the fields that size memory (all optional)."""
    out: dict[str, Any] = {}
    for key, item in _CONFIG_ITEMS.items():
        found = re.search(item, m.group(1))
        if not found:
            continue
        raw = found.group(1)
        if raw.isdigit():
            out[key] = int(raw)
        elif raw in ("True", "False"):
            out[key] = raw == "True"
        else:
            out[key] = None if raw == "None" else raw
    return out


def _args(m: re.Match[str]) -> dict[str, Any]:
    """The non-default CLI arguments, a Python dict literal (objects in it are skipped)."""
    try:
        parsed = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        parsed = {}
        for found in re.finditer(r"'(\w+)': ('[^']*'|[\w.+-]+)", m.group(1)):
            with contextlib.suppress(ValueError, SyntaxError):
                parsed[found.group(1)] = ast.literal_eval(found.group(2))
    if not isinstance(parsed, dict):
        return {}
    return {
        str(k): v for k, v in parsed.items() if isinstance(v, (int, float, str, bool)) or v is None
    }


Extractor = Callable[[re.Match[str]], dict[str, Any]]
PATTERNS: list[tuple[str, str, re.Pattern[str], Extractor]] = [
    (
        "kv_capacity",
        "info",
        re.compile(rf"(?P<device>GPU|CPU|XPU|TPU)? ?KV cache size: {_NUM} tokens"),
        _capacity,
    ),
    (
        "max_concurrency",
        "info",
        re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x"),
        _nums("tokens_per_request", "concurrency"),
    ),
    ("kv_memory", "info", re.compile(rf"Available KV cache memory: {_NUM} ?GiB"), _nums("gib")),
    (
        "kv_memory",
        "info",
        re.compile(rf"Explicitly set \({_NUM}/{_NUM}\) GiB for KV cache"),
        _nums("gib", "node_gib"),
    ),
    (
        "kv_memory",
        "info",
        re.compile(rf"reserved {_NUM} ?GiB memory for KV Cache as specified by kv_cache_memory"),
        _nums("gib"),
    ),
    ("model_memory", "info", re.compile(rf"Model loading took {_NUM} ?GiB"), _nums("gib")),
    (
        "v0_blocks",
        "info",
        re.compile(rf"# GPU blocks: {_NUM}, # CPU blocks: {_NUM}"),
        _nums("gpu_blocks", "cpu_blocks"),
    ),
    (
        "v0_memory",
        "info",
        re.compile(
            rf"model weights take {_NUM} ?GiB; non_torch_memory takes {_NUM} ?GiB; PyTorch "
            rf"activation peak memory takes {_NUM} ?GiB; the rest of the memory reserved for "
            rf"KV Cache is {_NUM} ?GiB"
        ),
        _v0_breakdown,
    ),
    (
        "v0_memory",
        "info",
        re.compile(rf"model weights take {_NUM} ?GiB.*reserved for KV Cache is {_NUM} ?GiB"),
        _nums("weights_gib", "kv_gib"),
    ),
    (
        "device_memory",
        "info",
        re.compile(rf"total_gpu_memory \({_NUM} ?GiB\) x gpu_memory_utilization \({_NUM}\)"),
        _nums("total_gib", "util"),
    ),
    (
        "device_memory",
        "info",
        re.compile(
            rf"Free memory on device \({_NUM}/{_NUM} ?GiB\) on startup\. Desired GPU memory "
            rf"utilization is \({_NUM}, {_NUM} ?GiB\)"
        ),
        _nums("free_gib", "total_gib", "util", "requested_gib"),
    ),
    (
        "device_memory",
        "info",
        re.compile(rf"worker init memory snapshot: .*?total_memory={_NUM} ?GiB"),
        _nums("total_gib"),
    ),
    (
        "graph_estimate",
        "info",
        re.compile(rf"Estimated CUDA graph memory: {_NUM} ?GiB total"),
        _nums("gib"),
    ),
    (
        "engine_defaults",
        "info",
        re.compile(r"Defaulting (max_num_batched_tokens|max_num_seqs) to (\d+)"),
        lambda m: {m[1]: int(m[2])},
    ),
    ("num_blocks", "info", re.compile(rf"num_gpu_blocks is: {_NUM}"), _nums("blocks")),
    ("num_blocks", "info", re.compile(rf"# CUDA blocks: {_NUM}"), _nums("blocks")),
    (
        "graph_memory",
        "info",
        re.compile(rf"Graph capturing finished in {_NUM} secs?, took {_NUM} ?GiB"),
        _nums("seconds", "gib"),
    ),
    (
        "graph_memory",
        "info",
        re.compile(rf"CUDA graph pool memory: {_NUM} ?GiB \(actual\), {_NUM} ?GiB \(estimated\)"),
        _nums("gib", "estimated_gib"),
    ),
    (
        "graph_estimate",
        "info",
        re.compile(
            rf"--gpu-memory-utilization={_NUM} is equivalent to --gpu-memory-utilization="
            rf"{_NUM} without CUDA graph memory profiling"
        ),
        _graph_util,
    ),
    (
        "memory_profile",
        "info",
        re.compile(r"Memory profiling takes [\d.]+ seconds\.?(.+)"),
        _profile,
    ),
    ("version", "info", re.compile(r"vLLM API server version (\S+)"), lambda m: {"version": m[1]}),
    (
        "version",
        "info",
        re.compile(r"Initializing an? (?:V1 )?LLM engine \(v([^)]+)\)"),
        lambda m: {"version": m[1]},
    ),
    ("engine_config", "info", re.compile(r"LLM engine \(v[^)]+\) with config: (.*)"), _config),
    ("engine_args", "info", re.compile(r"non-default args: (\{.*\})"), _args),
    (
        "batched_tokens",
        "info",
        re.compile(rf"Chunked prefill is enabled with max_num_batched_tokens={_NUM}"),
        _nums("tokens"),
    ),
    ("oom", "error", re.compile(r"No available memory for the cache blocks"), _oom),
    (
        "oom",
        "error",
        re.compile(
            rf"To serve at least one request with the model's max seq len \({_NUM}\)"
            rf"(?:.*?estimated maximum model length is {_NUM})?"
        ),
        _oom,
    ),
    ("oom", "error", re.compile(r"(?:torch\.)?OutOfMemoryError|CUDA out of memory"), _oom),
    (
        "preemption",
        "warning",
        re.compile(
            rf"is preempted by PreemptionMode\.(\w+).*?total_num_cumulative_preemption="
            rf"{_NUM}"
        ),
        lambda m: {"mode": m[1], "total": _number(m[2])},
    ),
]
# Kinds whose first pattern is the more specific one: one fact per line.
_FIRST_ONLY = frozenset({"oom", "v0_memory", "version"})


@dataclass(frozen=True)
class LogFact:
    """One parsed fact: an event kind, its severity, the values read and the line."""

    kind: str
    severity: str
    values: dict[str, Any]
    line: str

    @property
    def message(self) -> str:
        """A short human line for the event log."""
        v = self.values
        if self.kind == "kv_capacity":
            return f"engine KV cache: {v['tokens']:,.0f} tokens ({v.get('device') or 'GPU'})"
        if self.kind == "max_concurrency":
            return (
                f"engine max concurrency: {v['concurrency']:.2f}x at "
                f"{v['tokens_per_request']:,.0f} tokens per request"
            )
        if self.kind == "traceback":
            return f"engine traceback: {v['exception']}"
        if self.kind == "version":
            return f"engine vLLM version {v['version']}"
        if self.kind in ("engine_config", "engine_args"):
            shown = ", ".join(f"{k}={val}" for k, val in v.items())
            return f"engine {self.kind.replace('_', ' ')}: {shown}"[:300]
        return self.line.strip()[:300]


def parse_line(line: str) -> list[LogFact]:
    """Facts in one line (a V1 startup line may hold capacity and concurrency both)."""
    body = _PREFIX.sub("", line.rstrip("\n"), count=1)
    facts = []
    seen: set[str] = set()
    for kind, severity, pattern, extract in PATTERNS:
        if kind in seen and kind in _FIRST_ONLY:
            continue
        m = pattern.search(body)
        if not m:
            continue
        seen.add(kind)
        facts.append(LogFact(kind, severity, extract(m), body))
    return facts


@dataclass
class LogParser:
    """Stateful parsing of an engine's output: tracebacks span lines; crashes want the tail."""

    tail_lines: int = 200
    tail: deque[str] = field(default_factory=deque)
    _traceback: list[str] | None = None

    def __post_init__(self) -> None:
        self.tail = deque(maxlen=self.tail_lines)

    def feed(self, line: str) -> list[LogFact]:
        """Parse one line; return the facts it completes."""
        line = line.rstrip("\n")
        self.tail.append(line)
        body = _PREFIX.sub("", line, count=1)
        facts: list[LogFact] = []
        if self._traceback is not None:
            self._traceback.append(body)
            # The exception line ends a traceback: not indented, "Name: message" or "Name".
            if (
                body
                and not body.startswith((" ", "\t", "Traceback"))
                and (re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", body))
            ):
                facts.append(
                    LogFact(
                        "traceback",
                        "error",
                        {"exception": body[:300], "lines": self._traceback[-40:]},
                        body,
                    )
                )
                self._traceback = None
            elif len(self._traceback) > 400:
                self._traceback = None
        elif body.startswith("Traceback (most recent call last)"):
            self._traceback = [body]
        return facts + parse_line(line)


@dataclass(frozen=True)
class StartupReport:
    """How one vLLM start sized its KV cache, as its log says (None where the log is silent).

    Ranks print their own lines: weights and graphs are the fullest rank's, the KV budget
    and capacity the smallest rank's (vLLM sizes every rank's cache to the smallest).
    """

    version: str | None = None
    model: str | None = None
    dtype: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    enforce_eager: bool | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    total_gib: float | None = None
    weights_gib: float | None = None
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    non_kv_gib: float | None = None
    graph_gib: float | None = None
    graph_estimate_gib: float | None = None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    device: str | None = None
    num_blocks: int | None = None
    oom: str | None = None
    # The sampler's top-k/top-p path ("flashinfer" or "native"), as the release says at
    # start-up: the warm-up's memory differs by several copies of the logits between them.
    sampler: str | None = None
    enable_expert_parallel: bool | None = None

    @property
    def found(self) -> bool:
        """Whether the log said anything about memory at all."""
        return any(v is not None for v in (self.weights_gib, self.kv_gib, self.kv_tokens, self.oom))


_ARG_FIELDS = (
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "block_size",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "kv_cache_dtype",
    "quantization",
    "enforce_eager",
    "dtype",
    "enable_expert_parallel",
)
# vllm/v1/sample/ops/topk_topp_sampler.py: which top-k/top-p implementation a worker uses.
_SAMPLER = re.compile(
    r"(?P<flashinfer>Using FlashInfer for top-p & top-k sampling)|(?P<native>Falling back to "
    r"the PyTorch-native implementation of top-p & top-k sampling)"
)


def _merge(acc: dict[str, Any], key: str, value: Any, how: str = "last") -> None:
    if value is None:
        return
    old = acc.get(key)
    if old is None or how == "last":
        acc[key] = value
    elif how == "min":
        acc[key] = min(old, value)
    elif how == "max":
        acc[key] = max(old, value)


def read_startup(lines: Iterable[str]) -> StartupReport:
    """A startup log's memory story, from the same patterns the engine's follower uses."""
    acc: dict[str, Any] = {}
    args: dict[str, Any] = {}
    for line in lines:
        sampler = _SAMPLER.search(line)
        if sampler:
            acc["sampler"] = "flashinfer" if sampler["flashinfer"] else "native"
        for fact in parse_line(line):
            v = fact.values
            if fact.kind == "version":
                acc.setdefault("version", v["version"])
            elif fact.kind == "engine_config":
                for key, value in v.items():
                    _merge(acc, key, value)
            elif fact.kind == "engine_args":
                args.update(v)
            elif fact.kind == "batched_tokens":
                _merge(acc, "max_num_batched_tokens", int(v["tokens"]))
            elif fact.kind == "model_memory":
                _merge(acc, "weights_gib", v["gib"], "max")
            elif fact.kind == "kv_memory":
                _merge(acc, "kv_gib", v["gib"], "min")
            elif fact.kind == "kv_capacity":
                _merge(acc, "kv_tokens", int(v["tokens"]), "min")
                _merge(acc, "device", v.get("device"))
            elif fact.kind in ("num_blocks", "v0_blocks"):
                _merge(acc, "num_blocks", int(v.get("blocks") or v["gpu_blocks"]), "min")
            elif fact.kind == "graph_memory":
                _merge(acc, "graph_gib", v["gib"], "max")
                _merge(acc, "graph_estimate_gib", v.get("estimated_gib"), "max")
            elif fact.kind == "graph_estimate" and "gib" in v:
                _merge(acc, "graph_estimate_gib", v["gib"], "max")
            elif fact.kind == "graph_estimate":
                acc["graph_util_delta"] = v["util"] - v["util_without_graphs"]
            elif fact.kind == "engine_defaults":
                for key, value in v.items():
                    acc.setdefault(key, value)
            elif fact.kind == "memory_profile":
                _merge(acc, "non_kv_gib", v.get("non_kv_gib"), "max")
                _merge(acc, "activation_gib", v.get("torch_peak_gib"), "max")
                _merge(acc, "non_torch_gib", v.get("non_torch_gib"), "max")
                _merge(acc, "weights_gib", v.get("weights_gib"), "max")
            elif fact.kind == "v0_memory":
                _merge(acc, "weights_gib", v["weights_gib"], "max")
                _merge(acc, "kv_gib", v["kv_gib"], "min")
                _merge(acc, "activation_gib", v.get("activation_gib"), "max")
                _merge(acc, "non_torch_gib", v.get("non_torch_gib"), "max")
            elif fact.kind == "device_memory":
                _merge(acc, "total_gib", v["total_gib"])
                _merge(acc, "gpu_memory_utilization", v.get("util"))
            elif fact.kind == "oom":
                acc.setdefault("oom", fact.line.strip()[:300])
    for key in _ARG_FIELDS:
        if key in args and args[key] is not None:
            acc[key] = args[key]
    if "tensor_parallel_size" not in acc and "tp" in args:
        acc["tensor_parallel_size"] = args["tp"]
    delta = acc.pop("graph_util_delta", None)
    if delta is not None and acc.get("total_gib"):
        acc["graph_estimate_gib"] = round(delta * acc["total_gib"], 2)
    fields = StartupReport.__dataclass_fields__
    clean = {k: v for k, v in acc.items() if k in fields}
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "max_model_len"):
        if key in clean:
            clean[key] = int(clean[key])
    return StartupReport(**clean)
