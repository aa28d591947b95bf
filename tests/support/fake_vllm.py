"""A loopback server that serves changing vLLM-style /metrics text, for scraper and worker tests.

Not a vLLM stand-in for the product: it only exposes Prometheus text shaped like vLLM V1's
(or V0's old names), with counters and histograms that move when the test says so.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
    math.inf,
)
# vLLM's request-length buckets (1, 2, 5 per decade).
LENGTH_BUCKETS = (*(m * 10**e for e in range(5) for m in (1, 2, 5)), math.inf)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    math.inf,
)


@dataclass
class Histogram:
    """Cumulative buckets plus sum and count, like prometheus_client keeps them."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    total: float = 0.0
    n: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * len(self.bounds)

    def observe(self, value: float, times: int = 1) -> None:
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += times
        self.total += value * times
        self.n += times

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f"# HELP {name} histogram", f"# TYPE {name} histogram"]
        for b, c in zip(self.bounds, self.counts, strict=True):
            le = "+Inf" if math.isinf(b) else repr(float(b))
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {c}')
        out.append(f"{name}_count{{{labels}}} {self.n}")
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        return out


@dataclass
class FakeVllm:
    """Engine-like state; `style` is 'v1' (current names) or 'v0' (old names)."""

    style: str = "v1"
    model: str = "tiny-llama"
    kv_usage: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    num_blocks: int = 1000
    block_size: int = 32
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    # Exposed once observed (older fixtures leave them out): queue time, prompt lengths,
    # and finished requests by reason ({"stop": 10, "abort": 1}).
    queue_time: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    prompt_len: Histogram = field(default_factory=lambda: Histogram(LENGTH_BUCKETS))
    finished: dict[str, float] = field(default_factory=dict)
    # Counters that grow with wall time, per second: {"preemptions": 5.0, ...}.
    rates: dict[str, float] = field(default_factory=dict)
    _clock: float | None = None
    body_override: str | None = None
    status: int = 200
    delay_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def restart(self) -> None:
        """Counters and histograms start from zero, as after an engine restart."""
        with self.lock:
            self.preemptions = self.prompt_tokens = self.generation_tokens = 0.0
            self.prefix_queries = self.prefix_hits = 0.0
            self.ttft = Histogram(TTFT_BUCKETS)
            self.itl = Histogram(ITL_BUCKETS)
            self.e2e = Histogram(TTFT_BUCKETS)
            self.tpot = Histogram(ITL_BUCKETS)

    def text(self) -> str:
        if self.body_override is not None:
            return self.body_override
        with self.lock:
            now = time.time()
            if self._clock is not None:
                for name, per_s in self.rates.items():
                    setattr(self, name, getattr(self, name) + per_s * (now - self._clock))
            self._clock = now
            return "\n".join(self._lines()) + "\n"

    def _lines(self) -> list[str]:
        v1 = self.style == "v1"
        lab = f'engine="0",model_name="{self.model}"' if v1 else f'model_name="{self.model}"'
        kv = "vllm:kv_cache_usage_perc" if v1 else "vllm:gpu_cache_usage_perc"
        itl = "vllm:inter_token_latency_seconds" if v1 else "vllm:time_per_output_token_seconds"
        pq = "vllm:prefix_cache_queries" if v1 else "vllm:gpu_prefix_cache_queries"
        ph = "vllm:prefix_cache_hits" if v1 else "vllm:gpu_prefix_cache_hits"
        out = [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{self.block_size}",cache_dtype="auto",'
            f'enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",'
            f'num_gpu_blocks="{self.num_blocks}"}} 1.0',
        ]
        for name, kind, value in (
            ("vllm:num_requests_running", "gauge", self.running),
            ("vllm:num_requests_waiting", "gauge", self.waiting),
            (kv, "gauge", self.kv_usage),
        ):
            out += [f"# HELP {name} g", f"# TYPE {name} {kind}", f"{name}{{{lab}}} {value}"]
        for name, value in (
            ("vllm:num_preemptions", self.preemptions),
            ("vllm:prompt_tokens", self.prompt_tokens),
            ("vllm:generation_tokens", self.generation_tokens),
            (pq, self.prefix_queries),
            (ph, self.prefix_hits),
        ):
            out += [
                f"# HELP {name}_total c",
                f"# TYPE {name}_total counter",
                f"{name}_total{{{lab}}} {value}",
            ]
        out += self.ttft.lines("vllm:time_to_first_token_seconds", lab)
        out += self.itl.lines(itl, lab)
        out += self.e2e.lines("vllm:e2e_request_latency_seconds", lab)
        if v1:  # the per-request TPOT histogram arrived with V1
            out += self.tpot.lines("vllm:request_time_per_output_token_seconds", lab)
        if self.queue_time.n:
            out += self.queue_time.lines("vllm:request_queue_time_seconds", lab)
        if self.prompt_len.n:
            out += self.prompt_len.lines("vllm:request_prompt_tokens", lab)
        if self.finished:
            name = "vllm:request_success_total"
            out += [f"# HELP {name} c", f"# TYPE {name} counter"]
            out += [
                f'{name}{{{lab},finished_reason="{reason}"}} {n}'
                for reason, n in self.finished.items()
            ]
        return out


@contextmanager
def serve(fake: FakeVllm) -> Iterator[str]:
    """Serve `fake` on a loopback port; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if fake.delay_s:
                threading.Event().wait(fake.delay_s)
            if self.path != "/metrics":
                self.send_response(404)
                self.end_headers()
                return
            body = fake.text().encode()
            self.send_response(fake.status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
