"""Turn vLLM log lines into facts worth an event: KV capacity, memory, OOM, tracebacks.

Patterns cover V1 (0.9-0.32, GPU and CPU wording, numbers with thousands separators, the
two startup lines that newer releases print as one) and V0. A `LogParser` keeps the state
a traceback needs (it spans lines) and the last lines for crash reports.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

_NUM = r"([\d,]+(?:\.\d+)?)"
# vLLM prefixes each line with "(Process pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] ".
_PREFIX = re.compile(
    r"^(?:\((?P<proc>[\w-]+) pid=\d+\)\s+)?(?:(?P<level>[A-Z]+)\s+\d\d-\d\d "
    r"[\d:]+\s+\[[^\]]+\]\s+)?"
)

PATTERNS: list[tuple[str, str, re.Pattern[str]]] = [
    (
        "kv_capacity",
        "info",
        re.compile(rf"(?P<device>GPU|CPU|XPU|TPU)? ?KV cache size: {_NUM} tokens"),
    ),
    (
        "max_concurrency",
        "info",
        re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x"),
    ),
    ("kv_memory", "info", re.compile(rf"Available KV cache memory: {_NUM} ?GiB")),
    ("kv_memory", "info", re.compile(rf"Explicitly set \({_NUM}/{_NUM}\) GiB for KV cache")),
    ("model_memory", "info", re.compile(rf"Model loading took {_NUM} ?GiB")),
    ("v0_blocks", "info", re.compile(rf"# GPU blocks: {_NUM}, # CPU blocks: {_NUM}")),
    (
        "v0_memory",
        "info",
        re.compile(rf"model weights take {_NUM} ?GiB.*reserved for KV Cache is {_NUM} ?GiB"),
    ),
    ("oom", "error", re.compile(r"No available memory for the cache blocks")),
    (
        "oom",
        "error",
        re.compile(
            rf"To serve at least one request with the model's max seq len \({_NUM}\)"
            rf"(?:.*?estimated maximum model length is {_NUM})?"
        ),
    ),
    ("oom", "error", re.compile(r"(?:torch\.)?OutOfMemoryError|CUDA out of memory")),
    (
        "preemption",
        "warning",
        re.compile(
            rf"is preempted by PreemptionMode\.(\w+).*?total_num_cumulative_preemption="
            rf"{_NUM}"
        ),
    ),
]


def _number(text: str | None) -> float | None:
    return None if text is None else float(text.replace(",", ""))


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
        return self.line.strip()[:300]


def parse_line(line: str) -> list[LogFact]:
    """Facts in one line (a V1 startup line may hold capacity and concurrency both)."""
    body = _PREFIX.sub("", line.rstrip("\n"), count=1)
    facts = []
    for kind, severity, pattern in PATTERNS:
        m = pattern.search(body)
        if not m:
            continue
        groups = list(m.groups())
        values: dict[str, Any] = {}
        if kind == "kv_capacity":
            values = {"device": m.group("device"), "tokens": _number(groups[1])}
        elif kind == "max_concurrency":
            values = {"tokens_per_request": _number(groups[0]), "concurrency": _number(groups[1])}
        elif kind in ("kv_memory", "model_memory"):
            values = {"gib": _number(groups[0])}
        elif kind == "v0_blocks":
            values = {"gpu_blocks": _number(groups[0]), "cpu_blocks": _number(groups[1])}
        elif kind == "v0_memory":
            values = {"weights_gib": _number(groups[0]), "kv_gib": _number(groups[1])}
        elif kind == "oom" and groups:
            values = {
                "max_seq_len": _number(groups[0]),
                "estimated_max_model_len": _number(groups[1]) if len(groups) > 1 else None,
            }
        elif kind == "preemption":
            values = {"mode": groups[0], "total": _number(groups[1])}
        facts.append(LogFact(kind, severity, values, body))
        if kind == "oom":
            break  # one OOM fact per line, the most specific pattern first
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
