"""Time a Llama-shaped decoder's forward steps on this machine's GPU: what the roofline of
planner/simulate/roofline.py predicts (weights and KV read against bandwidth, FLOPs against
peak), measured, so its error and the efficiencies really reached can be stated.

Standalone on purpose (stdlib and torch only, nothing of the project): it runs on a bare GPU
machine that has torch and no project dependencies.

    python -u benchmarks/gpu_steps.py SPEC.json OUT.json [--budget-s 150]

SPEC comes from `python -m benchmarks.roofline_gpu spec` (the model's shapes and the cases);
OUT, rewritten after every case so a run cut short still leaves what it measured, is read by
`python -m benchmarks.roofline_gpu compare SPEC OUT`.

The model: random bf16 weights in vLLM's layout (fused qkv and gate_up projections), RMSNorm,
rotary embeddings, GQA attention through `scaled_dot_product_attention`, a SwiGLU MLP, a
final norm and the lm_head for the last token of each sequence only; the embedding is a
lookup. Decode steps (B sequences, each one new token over a contiguous KV cache of C
tokens per layer) are timed eagerly and replayed from a CUDA graph: the graph's time is the
kernels', eager minus graph the launches'; their attention alone is timed too. The
attention kernel is the fastest of the SDPA backends that run at each case's shapes.
Prefill steps (one sequence of T tokens, causal) are timed eagerly. Mixed steps are one
step of vLLM V1's chunked prefill: B decodes (as above) and a prompt chunk of T tokens
(nothing of its prompt cached) in one forward, the projections, norms and MLP over the B+T
tokens together (one GEMM of B+T rows each), attention in two SDPA calls a layer (the
decodes over their caches, the chunk causally over itself; each part's kernel chosen at its
own shapes) and the lm_head for the B decodes and the chunk's last token (its prompt taken
to end in this chunk, so that it samples); timed eagerly and from a CUDA graph of the whole
step, as decode steps are. Also a device-to-device copy and an n^3 bf16 matmul: the
machine's reachable ceilings. CUDA events time each repetition; the median is kept. On a
machine without CUDA it runs on the CPU (tiny shapes, for testing), without graphs. A case
that runs out of memory or fails is recorded as such and the run goes on; cases past the
time budget are recorded as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch  # type: ignore[import-not-found,unused-ignore]
import torch.nn.functional as F  # type: ignore[import-not-found,unused-ignore]

# torch.nn.attention (2.3+) restricts SDPA to one backend; without it, torch's own choice.
ATTENTION: Any
try:
    ATTENTION = importlib.import_module("torch.nn.attention")
except ImportError:  # pragma: no cover - old torch
    ATTENTION = None

DTYPE = torch.bfloat16
BF16_BYTES = 2
# (backend, how GQA is done), each timed on the case's own shapes; the fastest that runs is
# the step's (vLLM's kernels are FlashAttention's or FlashInfer's, tuned for decode; torch's
# default dispatch only where no named backend runs). "enable_gqa": SDPA's own
# grouping; "fold": a decode's G query heads per KV head folded into G query rows over that
# head (exact for one new token, no mask needed; what flash-decoding kernels do); "expand":
# K and V repeated per query head (a copy of the cache each step: last resort).
DECODE_ATTENTION = [
    ("FLASH_ATTENTION", "enable_gqa"),
    ("FLASH_ATTENTION", "fold"),
    ("CUDNN_ATTENTION", "enable_gqa"),
    ("EFFICIENT_ATTENTION", "enable_gqa"),
    ("EFFICIENT_ATTENTION", "fold"),
    (None, "enable_gqa"),
    (None, "fold"),
    (None, "expand"),
]
PREFILL_ATTENTION = [
    ("FLASH_ATTENTION", "enable_gqa"),
    ("CUDNN_ATTENTION", "enable_gqa"),
    ("EFFICIENT_ATTENTION", "enable_gqa"),
    ("FLASH_ATTENTION", "expand"),
    (None, "enable_gqa"),
    (None, "expand"),
]
RUN_DEFAULTS: dict[str, Any] = {
    "warmup": 3,
    "reps": 10,  # eager decode
    "graph_reps": 20,  # decode replayed from a CUDA graph, and the attention alone
    "prefill_warmup": 2,
    "prefill_reps": 5,
    "ceiling_reps": 20,
    "copy_bytes": 1 << 31,  # each way: the copy moves twice this
    "matmul_n": 8192,
    "budget_s": 150.0,
    "seed": 0,
}


def log(msg: str) -> None:
    """A progress line, flushed: the device's output comes back as it is printed."""
    print(f"[gpu_steps {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True, slots=True)
class Shapes:
    """The decoder's sizes, as the spec gives them (Hugging Face names in the spec)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    rope_theta: float
    tied: bool

    @classmethod
    def from_spec(cls, m: dict[str, Any]) -> Shapes:
        """Read the spec's `model`; refuse what this script cannot build."""
        if str(m.get("dtype", "bfloat16")) not in ("bfloat16", "bf16"):
            raise SystemExit(f"only bf16 models are built, the spec says {m['dtype']}")
        s = cls(
            hidden=int(m["hidden_size"]),
            layers=int(m["num_layers"]),
            heads=int(m["num_attention_heads"]),
            kv_heads=int(m["num_kv_heads"]),
            head_dim=int(m["head_dim"]),
            intermediate=int(m["intermediate_size"]),
            vocab=int(m["vocab_size"]),
            eps=float(m.get("rms_norm_eps", 1e-5)),
            rope_theta=float(m.get("rope_theta", 10000.0)),
            tied=bool(m.get("tie_word_embeddings", False)),
        )
        if s.heads % s.kv_heads or s.head_dim % 2:
            raise SystemExit("heads must be a multiple of KV heads, and head_dim even")
        return s

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one decoder layer (two norms, qkv, o, gate_up, down)."""
        qkv = self.hidden * (self.q_size + 2 * self.kv_size)
        mlp = 3 * self.hidden * self.intermediate
        return 2 * self.hidden + qkv + self.q_size * self.hidden + mlp

    def params(self) -> int:
        """All parameters built (the embedding counted once when tied)."""
        edges = self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden
        return self.layers * self.layer_params() + edges

    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer."""
        return self.layers * 2 * self.kv_size * BF16_BYTES

    def matmul_flops(self, tokens: int, logits: int) -> int:
        """FLOPs of the projections for `tokens` and the lm_head for `logits` rows."""
        per_token = 2 * (self.layer_params() - 2 * self.hidden)
        return self.layers * tokens * per_token + 2 * self.hidden * self.vocab * logits

    def attention_flops(self, pairs: int) -> int:
        """FLOPs of QK^T and PV for `pairs` query-key pairs, all heads and layers."""
        return 4 * pairs * self.heads * self.head_dim * self.layers


@dataclass(slots=True)
class Layer:
    """One decoder layer's weights, vLLM's fused layout ([out, in], as F.linear takes)."""

    norm1: Any
    qkv: Any
    o: Any
    norm2: Any
    gate_up: Any
    down: Any


class Model:
    """Random weights of the decoder; the values are irrelevant to the timing, only kept
    finite (scaled by 1/sqrt(fan-in)) so no kernel meets NaNs."""

    def __init__(self, s: Shapes, device: Any, seed: int) -> None:
        torch.manual_seed(seed)
        self.s = s

        def rand(rows: int, cols: int) -> Any:
            w = torch.empty(rows, cols, dtype=DTYPE, device=device)
            return w.normal_(0.0, 1.0 / math.sqrt(cols))

        def ones() -> Any:
            return torch.ones(s.hidden, dtype=DTYPE, device=device)

        self.embed = rand(s.vocab, s.hidden)
        self.layers = [
            Layer(
                norm1=ones(),
                qkv=rand(s.q_size + 2 * s.kv_size, s.hidden),
                o=rand(s.hidden, s.q_size),
                norm2=ones(),
                gate_up=rand(2 * s.intermediate, s.hidden),
                down=rand(s.hidden, s.intermediate),
            )
            for _ in range(s.layers)
        ]
        self.norm = ones()
        self.lm_head = self.embed if s.tied else rand(s.vocab, s.hidden)

    def bytes(self) -> int:
        """Bytes of the weights as allocated."""
        return self.s.params() * BF16_BYTES

    def bytes_read(self, tokens: int) -> int:
        """Bytes of weights a step over `tokens` reads at the least: all but the embedding
        rows no token looks up (none spared when the lm_head is the embedding)."""
        unused = 0 if self.s.tied else max(self.s.vocab - tokens, 0) * self.s.hidden
        return self.bytes() - unused * BF16_BYTES


def rms_norm(x: Any, w: Any, eps: float) -> Any:
    """RMSNorm: torch's own where it has one (2.4+), else spelled out in fp32."""
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(positions: Any, s: Shapes) -> tuple[Any, Any]:
    """cos and sin for `positions`, shaped [N, 1, head_dim/2] to broadcast over heads."""
    half = s.head_dim // 2
    inv = s.rope_theta ** (-torch.arange(half, dtype=torch.float32, device=positions.device) / half)
    angles = positions.float()[:, None] * inv[None, :]
    return angles.cos().to(DTYPE)[:, None, :], angles.sin().to(DTYPE)[:, None, :]


def rope(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary embedding (rotate-half form) of x [N, heads, head_dim]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


Attend = Callable[[int, Any, Any, Any], Any]


def forward(m: Model, ids: Any, cos: Any, sin: Any, attend: Attend, rows: Any = None) -> Any:
    """One step over the N tokens `ids`: logits for the tokens `rows` picks (an index tensor
    or a slice, as vLLM's logits indices: those whose sequences sample), for every token
    when None (a decode: each is its sequence's last)."""
    s = m.s
    x = F.embedding(ids, m.embed)
    for i, layer in enumerate(m.layers):
        h = rms_norm(x, layer.norm1, s.eps)
        qkv = F.linear(h, layer.qkv)
        q, k, v = qkv.split((s.q_size, s.kv_size, s.kv_size), dim=-1)  # type: ignore[no-untyped-call,unused-ignore]
        q = rope(q.reshape(-1, s.heads, s.head_dim), cos, sin)
        k = rope(k.reshape(-1, s.kv_heads, s.head_dim), cos, sin)
        v = v.reshape(-1, s.kv_heads, s.head_dim)
        x = x + F.linear(attend(i, q, k, v), layer.o)
        h = rms_norm(x, layer.norm2, s.eps)
        gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, layer.down)
    if rows is not None:
        x = x[rows]
    return F.linear(rms_norm(x, m.norm, s.eps), m.lm_head)


def sdpa(q: Any, k: Any, v: Any, causal: bool, mode: str) -> Any:
    """Attention of q [B, H, Lq, D] over k, v [B, KVH, Lk, D], GQA done as `mode` says;
    returns [B, H, Lq, D] (or, folded, [B, KVH, G, D]: the same elements in the same
    order)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads == kv_heads:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    group = heads // kv_heads
    if mode == "enable_gqa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    if mode == "fold":
        if causal or q.shape[2] != 1:
            raise RuntimeError("folding the query heads holds for one new token only")
        b, _, _, d = q.shape
        return F.scaled_dot_product_attention(q.reshape(b, kv_heads, group, d), k, v)
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def backend_context(name: str | None) -> contextlib.AbstractContextManager[Any]:
    """Restrict SDPA to one backend (None: torch's own choice)."""
    if name is None or ATTENTION is None:
        return contextlib.nullcontext()
    restricted: contextlib.AbstractContextManager[Any] = ATTENTION.sdpa_kernel(
        [getattr(ATTENTION.SDPBackend, name)]
    )
    return restricted


def choose_attention(
    candidates: list[tuple[str | None, str]],
    layers: Callable[[str], Any],
    device: Any,
    use_graph: bool,
) -> tuple[str | None, str, dict[str, Any]]:
    """The fastest (backend, GQA mode) at the case's own shapes: `layers(mode)` (the
    attention of every layer) is timed under each candidate that runs (from a CUDA graph
    with `use_graph`, else eagerly, a few times), torch's default dispatch only where no
    named backend runs. Why a backend does not fit (its warnings) is silenced, its error
    kept with the timings."""
    tried: dict[str, Any] = {}
    best: tuple[float, str | None, str] | None = None
    for backend, mode in candidates:
        if backend is None and best is not None:
            break
        if backend is not None and not hasattr(getattr(ATTENTION, "SDPBackend", None), backend):
            continue

        def fn(backend: str | None = backend, mode: str = mode) -> None:
            with backend_context(backend):
                layers(mode)

        name = f"{backend or 'default'}/{mode}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
                if use_graph:
                    with captured(fn, 1) as replay:
                        took = timed(replay, device, 1, 5)["median_s"]
                else:
                    took = timed(fn, device, 1, 3)["median_s"]
        except Exception as err:
            tried[name] = describe_error(err)
            continue
        tried[name] = took
        if best is None or took < best[0]:
            best = (took, backend, mode)
    if best is None:
        raise RuntimeError(f"no attention backend ran: {tried}")
    return best[1], best[2], tried


def sync(device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: Any, warmup: int, reps: int) -> dict[str, Any]:
    """Median, min and max seconds of `reps` calls of `fn` after `warmup`; each timed on its
    own by CUDA events (the GPU's time from the first launch to the last kernel's end, so an
    eager step's launch gaps count) or, on a CPU, by the clock."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    for _ in range(reps):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call,unused-ignore]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call,unused-ignore]
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "reps": reps,
    }


@contextlib.contextmanager
def captured(fn: Callable[[], Any], warmup: int) -> Iterator[Callable[[], Any]]:
    """`fn` captured in a CUDA graph (warmed up on a side stream first, as torch asks);
    yields its replay. The graph and its memory pool go at the end."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call,unused-ignore]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        yield graph.replay
    finally:
        del graph


def describe_error(err: BaseException) -> str:
    """One line for the results: out of memory said as such."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    if (oom and isinstance(err, oom)) or any(
        words in text.lower() for words in ("out of memory", "can't allocate memory")
    ):
        return f"out of memory: {text[:300]}"
    return f"{type(err).__name__}: {text[:300]}"


def free(device: Any) -> None:
    """Give back what the last case held (its cache, graph pool and activations)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: Any) -> int | None:
    return int(torch.cuda.max_memory_allocated()) if device.type == "cuda" else None


def attention_alone(
    attend: Callable[[str], Attend], s: Shapes, rows: int, device: Any
) -> Callable[[str], None]:
    """Every layer's attention of a step with `rows` query tokens, and nothing else: what
    chooses the kernel and times attention apart from the rest."""
    q0 = torch.randn(rows, s.heads, s.head_dim, dtype=DTYPE, device=device)
    k0 = torch.randn(rows, s.kv_heads, s.head_dim, dtype=DTYPE, device=device)

    def layers(mode: str) -> None:
        go = attend(mode)
        for i in range(s.layers):
            go(i, q0, k0, k0)

    return layers


def decode_attend(
    s: Shapes, kcache: list[Any], vcache: list[Any], c: int
) -> Callable[[str], Attend]:
    """Attention of B decodes, each one new token at position `c` over its cache (the
    caches [B, KV heads, C+1, head_dim] a layer: C cached tokens, the new one written at
    `c`), GQA done as the mode says."""

    def attend(mode: str) -> Attend:
        def go(i: int, q: Any, k: Any, v: Any) -> Any:
            kc, vc = kcache[i], vcache[i]
            kc[:, :, c] = k
            vc[:, :, c] = v
            return sdpa(q.unsqueeze(2), kc, vc, False, mode).reshape(q.shape[0], s.q_size)

        return go

    return attend


def prefill_attend(s: Shapes, kcache: list[Any], vcache: list[Any]) -> Callable[[str], Attend]:
    """Attention of one sequence's T tokens, nothing of it cached, causal over themselves
    (their K and V written to the caches [1, KV heads, T, head_dim] a layer first)."""

    def attend(mode: str) -> Attend:
        def go(i: int, q: Any, k: Any, v: Any) -> Any:
            kc, vc = kcache[i], vcache[i]
            kc[0] = k.transpose(0, 1)
            vc[0] = v.transpose(0, 1)
            out = sdpa(q.transpose(0, 1).unsqueeze(0), kc, vc, True, mode)
            return out[0].transpose(0, 1).reshape(q.shape[0], s.q_size)

        return go

    return attend


def mixed_attend(
    b: int, decodes: tuple[str | None, Attend], chunk: tuple[str | None, Attend]
) -> Attend:
    """A mixed step's attention: the first `b` rows are decodes, the rest one prompt chunk;
    each part through its own attention under its own SDPA backend (two calls a layer), the
    outputs joined in the rows' order."""
    (d_backend, d_go), (c_backend, c_go) = decodes, chunk

    def go(i: int, q: Any, k: Any, v: Any) -> Any:
        with backend_context(d_backend):
            out_d = d_go(i, q[:b], k[:b], v[:b])
        with backend_context(c_backend):
            out_c = c_go(i, q[b:], k[b:], v[b:])
        return torch.cat((out_d, out_c))

    return go


def random_caches(shape: tuple[int, ...], layers: int, device: Any, fill: bool) -> list[Any]:
    """One cache tensor a layer (random values with `fill`, else left as allocated)."""
    made = [torch.empty(shape, dtype=DTYPE, device=device) for _ in range(layers)]
    return [t.normal_() for t in made] if fill else made


def time_step(
    step: Callable[[], Any],
    attention: Callable[[], None],
    case: dict[str, Any],
    device: Any,
    run: dict[str, Any],
) -> None:
    """The step eagerly and, on a GPU, replayed from a CUDA graph; its attention alone from
    a graph (eagerly on a CPU); into `case`."""
    cuda = device.type == "cuda"
    case["eager"] = timed(step, device, run["warmup"], run["reps"])
    if not cuda:
        case["attention"] = timed(attention, device, run["warmup"], run["reps"])
    for key, fn in (("graph", step), ("attention", attention)) if cuda else ():
        try:
            with captured(fn, run["warmup"]) as replay:
                case[key] = timed(replay, device, run["warmup"], run["graph_reps"])
        except Exception as err:  # the eager figure stands; say why this one is missing
            case[f"{key}_error"] = describe_error(err)
    case["peak_memory_bytes"] = peak_bytes(device)


def decode_case(m: Model, case: dict[str, Any], device: Any, run: dict[str, Any]) -> None:
    """B sequences of C cached tokens, one new token each: the step eagerly, from a CUDA
    graph, and its attention alone (all layers), into `case`."""
    s = m.s
    b, c = int(case["batch"]), int(case["context"])
    shape = (b, s.kv_heads, c + 1, s.head_dim)  # C cached tokens and the new one
    kcache = random_caches(shape, s.layers, device, True)
    vcache = random_caches(shape, s.layers, device, True)
    ids = torch.randint(0, s.vocab, (b,), device=device)
    cos, sin = rope_tables(torch.full((b,), c, device=device), s)
    attend = decode_attend(s, kcache, vcache, c)
    layers = attention_alone(attend, s, b, device)

    cuda = device.type == "cuda"
    backend, mode, tried = choose_attention(DECODE_ATTENTION, layers, device, cuda)
    case["attention_backend"] = f"{backend or 'default'}/{mode}"
    case["attention_candidates"] = tried
    go = attend(mode)

    def step() -> Any:
        with backend_context(backend):
            return forward(m, ids, cos, sin, go)

    def attention() -> None:
        with backend_context(backend):
            layers(mode)

    time_step(step, attention, case, device, run)


def prefill_case(m: Model, case: dict[str, Any], device: Any, run: dict[str, Any]) -> None:
    """One sequence of T tokens, causal, its K and V written to a contiguous cache; eager."""
    s = m.s
    t = int(case["tokens"])
    shape = (1, s.kv_heads, t, s.head_dim)
    kcache = random_caches(shape, s.layers, device, False)
    vcache = random_caches(shape, s.layers, device, False)
    ids = torch.randint(0, s.vocab, (t,), device=device)
    cos, sin = rope_tables(torch.arange(t, device=device), s)
    attend = prefill_attend(s, kcache, vcache)
    layers = attention_alone(attend, s, t, device)

    backend, mode, tried = choose_attention(PREFILL_ATTENTION, layers, device, False)
    case["attention_backend"] = f"{backend or 'default'}/{mode}"
    case["attention_candidates"] = tried
    go = attend(mode)

    def step() -> Any:
        with backend_context(backend):
            return forward(m, ids, cos, sin, go, slice(t - 1, t))

    case["eager"] = timed(step, device, run["prefill_warmup"], run["prefill_reps"])
    case["peak_memory_bytes"] = peak_bytes(device)


@dataclass(slots=True)
class MixedStep:
    """The inputs of a mixed step: B decodes (rows 0..B-1, each at position C over its
    cache) then a prompt chunk of T tokens (rows B..B+T-1, positions 0..T-1)."""

    b: int
    c: int
    t: int
    ids: Any
    cos: Any
    sin: Any
    rows: Any  # the rows whose logits are computed: the decodes and the chunk's last
    decode_k: list[Any]  # the decodes' caches, a layer each
    decode_v: list[Any]
    chunk_k: list[Any]  # the chunk's
    chunk_v: list[Any]
    decodes: Callable[[str], Attend]  # their attentions over those caches, by GQA mode
    chunk: Callable[[str], Attend]


def mixed_step(s: Shapes, b: int, c: int, t: int, device: Any) -> MixedStep:
    """A mixed step's inputs and caches, random (the decodes' caches filled)."""
    decode_shape = (b, s.kv_heads, c + 1, s.head_dim)
    chunk_shape = (1, s.kv_heads, t, s.head_dim)
    ids = torch.randint(0, s.vocab, (b + t,), device=device)
    positions = torch.cat((torch.full((b,), c, device=device), torch.arange(t, device=device)))
    cos, sin = rope_tables(positions, s)
    rows = torch.cat((torch.arange(b, device=device), torch.full((1,), b + t - 1, device=device)))
    decode_k = random_caches(decode_shape, s.layers, device, True)
    decode_v = random_caches(decode_shape, s.layers, device, True)
    chunk_k = random_caches(chunk_shape, s.layers, device, False)
    chunk_v = random_caches(chunk_shape, s.layers, device, False)
    return MixedStep(
        b=b,
        c=c,
        t=t,
        ids=ids,
        cos=cos,
        sin=sin,
        rows=rows,
        decode_k=decode_k,
        decode_v=decode_v,
        chunk_k=chunk_k,
        chunk_v=chunk_v,
        decodes=decode_attend(s, decode_k, decode_v, c),
        chunk=prefill_attend(s, chunk_k, chunk_v),
    )


def mixed_case(m: Model, case: dict[str, Any], device: Any, run: dict[str, Any]) -> None:
    """B decodes over C cached tokens and a prompt chunk of T tokens in one forward (vLLM
    V1's chunked prefill): eagerly, from a CUDA graph, and its attention alone, into
    `case`. The decodes' attention kernel and the chunk's are each the fastest at their own
    shapes (timed from a graph on a GPU: the whole step is replayed from one). vLLM replays
    such a step from piecewise graphs, attention run eagerly between them, and only up to
    its largest captured size (a step over it runs eagerly): its forward's time lies
    roughly between the graph's and the eager one here."""
    s = m.s
    b, c, t = int(case["batch"]), int(case["context"]), int(case["chunk"])
    ms = mixed_step(s, b, c, t, device)
    cuda = device.type == "cuda"
    d_backend, d_mode, d_tried = choose_attention(
        DECODE_ATTENTION, attention_alone(ms.decodes, s, b, device), device, cuda
    )
    c_backend, c_mode, c_tried = choose_attention(
        PREFILL_ATTENTION, attention_alone(ms.chunk, s, t, device), device, cuda
    )
    case["attention_backend"] = (
        f"{d_backend or 'default'}/{d_mode} + {c_backend or 'default'}/{c_mode}"
    )
    case["attention_candidates"] = {"decodes": d_tried, "chunk": c_tried}
    go = mixed_attend(b, (d_backend, ms.decodes(d_mode)), (c_backend, ms.chunk(c_mode)))
    layers = attention_alone(lambda _mode: go, s, b + t, device)

    def step() -> Any:
        return forward(m, ms.ids, ms.cos, ms.sin, go, ms.rows)

    def attention() -> None:
        layers("")

    time_step(step, attention, case, device, run)


def copy_ceiling(device: Any, run: dict[str, Any]) -> dict[str, Any]:
    """A plain device-to-device copy: bytes read and written over its time."""
    n = int(run["copy_bytes"]) // BF16_BYTES
    src = torch.empty(n, dtype=DTYPE, device=device).normal_()
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), device, run["warmup"], run["ceiling_reps"])
    moved = 2 * n * BF16_BYTES
    return {**t, "bytes_moved": moved, "gb_per_s": moved / t["median_s"] / 1e9}


def matmul_ceiling(device: Any, run: dict[str, Any]) -> dict[str, Any]:
    """A square bf16 matmul of side n: 2n^3 FLOPs over its time."""
    n = int(run["matmul_n"])
    a = torch.randn(n, n, dtype=DTYPE, device=device)
    b = torch.randn(n, n, dtype=DTYPE, device=device)
    c = torch.empty(n, n, dtype=DTYPE, device=device)
    t = timed(lambda: torch.matmul(a, b, out=c), device, run["warmup"], run["ceiling_reps"])
    flops = 2 * n**3
    return {**t, "n": n, "flops": flops, "tflops": flops / t["median_s"] / 1e12}


def ceilings(device: Any, run: dict[str, Any]) -> dict[str, Any]:
    """What the machine reaches at all, each ceiling's error recorded in its place."""
    out: dict[str, Any] = {}
    for name, fn in (("copy", copy_ceiling), ("matmul", matmul_ceiling)):
        try:
            out[name] = fn(device, run)
        except Exception as err:
            out[name] = {"error": describe_error(err)}
        free(device)
    return out


def environment(device: Any) -> dict[str, Any]:
    """What ran: the device, torch and CUDA versions, and nvidia-smi's view where it is."""
    env: dict[str, Any] = {
        "device": device.type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu_name=props.name,
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),  # type: ignore[no-untyped-call,unused-ignore]
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            total_memory_bytes=int(props.total_memory),
        )
        query = "name,driver_version,clocks.max.sm,clocks.max.memory,power.limit,memory.total"
        try:
            smi = subprocess.run(
                ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=15,
                check=False,
            )
            env["nvidia_smi"] = {"query": query, "output": smi.stdout.strip()}
        except (OSError, subprocess.SubprocessError) as err:
            env["nvidia_smi"] = {"error": str(err)}
    else:
        env["gpu_name"] = None
        env["cpu"] = platform.processor() or platform.machine()
    return env


def write(path: Path, result: dict[str, Any]) -> None:
    """Write the results whole (through a temporary file: a cut-off run leaves the last
    complete version)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def measure(spec: dict[str, Any], out: Path, budget_s: float | None) -> dict[str, Any]:
    """Run the spec's cases and write the results to `out` after each."""
    t0 = time.monotonic()
    run = {**RUN_DEFAULTS, **spec.get("run", {})}
    if budget_s is not None:
        run["budget_s"] = budget_s
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    s = Shapes.from_spec(spec["model"])
    env = environment(device)
    log(
        f"device {env.get('gpu_name') or env['device']}, torch {env['torch']}, "
        f"CUDA {env.get('cuda')}, Python {env['python']}"
    )
    result: dict[str, Any] = {
        "kind": "kvscope.gpu_steps.result",
        "version": 1,
        "spec_model": spec["model"].get("name"),
        "env": env,
        "run": run,
        "shapes": asdict(s),
        "params": s.params(),
        "weight_bytes": s.params() * BF16_BYTES,
        "kv_bytes_per_token": s.kv_bytes_per_token(),
        "ceilings": {},
        "cases": [],
        "done": False,
    }
    write(out, result)
    torch.set_grad_enabled(False)
    with torch.inference_mode():
        result["ceilings"] = ceilings(device, run)
        c = result["ceilings"]
        log(
            f"copy {c['copy'].get('gb_per_s', float('nan')):,.0f} GB/s, matmul "
            f"{c['matmul'].get('tflops', float('nan')):,.1f} TFLOP/s"
        )
        write(out, result)
        t = time.monotonic()
        model = Model(s, device, int(run["seed"]))
        sync(device)
        log(
            f"built {s.params() / 1e9:.3f} B parameters ({model.bytes() / 1e9:.2f} GB) "
            f"in {time.monotonic() - t:.1f} s"
        )
        for raw in spec["cases"]:
            case = measure_case(model, raw, device, run, t0)
            result["cases"].append(case)
            result["elapsed_s"] = time.monotonic() - t0
            write(out, result)
            log(summary(case))
            free(device)
    result["done"] = True
    result["elapsed_s"] = time.monotonic() - t0
    write(out, result)
    log(f"done in {result['elapsed_s']:.1f} s; results in {out}")
    return result


def measure_case(
    model: Model, raw: dict[str, Any], device: Any, run: dict[str, Any], t0: float
) -> dict[str, Any]:
    """One case's figures: what it did (tokens, FLOPs, bytes), its timings or its error."""
    s = model.s
    kind = raw["kind"]
    case: dict[str, Any] = {"id": raw["id"], "kind": kind}
    if kind == "decode":
        b, c = int(raw["batch"]), int(raw["context"])
        pairs = b * (c + 1)
        case.update(
            batch=b,
            context=c,
            tokens=b,
            # What the step reads at the least: every weight but the embedding's unused
            # rows, and each sequence's whole cache.
            weights_read_bytes=model.bytes_read(b),
            kv_read_bytes=pairs * s.kv_bytes_per_token(),
            kv_cache_bytes=pairs * s.kv_bytes_per_token(),
            flops=s.matmul_flops(b, b) + s.attention_flops(pairs),
        )
    elif kind == "prefill":
        t = int(raw["tokens"])
        pairs = t * (t + 1) // 2
        case.update(
            tokens=t,
            weights_read_bytes=model.bytes_read(t),
            kv_cache_bytes=t * s.kv_bytes_per_token(),
            flops=s.matmul_flops(t, 1) + s.attention_flops(pairs),
        )
    elif kind == "mixed":
        b, c, t = int(raw["batch"]), int(raw["context"]), int(raw["chunk"])
        cached = b * (c + 1) + t  # the decodes' caches with their new tokens, the chunk's own
        case.update(
            batch=b,
            context=c,
            chunk=t,
            tokens=b + t,
            # At the least: the weights (as above) once for all B+T tokens, the decodes'
            # caches and the chunk's own K and V once.
            weights_read_bytes=model.bytes_read(b + t),
            kv_read_bytes=cached * s.kv_bytes_per_token(),
            kv_cache_bytes=cached * s.kv_bytes_per_token(),
            # The lm_head for the B decodes and the chunk's last token.
            flops=s.matmul_flops(b + t, b + 1) + s.attention_flops(b * (c + 1) + t * (t + 1) // 2),
        )
    else:
        case["error"] = f"unknown case kind {kind!r}"
        return case
    if time.monotonic() - t0 > float(run["budget_s"]):
        case["skipped"] = f"past the run's budget of {run['budget_s']:g} s"
        return case
    started = time.monotonic()
    try:
        {"decode": decode_case, "prefill": prefill_case, "mixed": mixed_case}[kind](
            model, case, device, run
        )
    except Exception as err:
        case["error"] = describe_error(err)
    case["wall_s"] = time.monotonic() - started
    return case


def summary(case: dict[str, Any]) -> str:
    """One progress line for a case."""
    parts = [case["id"]]
    for key in ("eager", "graph", "attention"):
        if isinstance(case.get(key), dict):
            parts.append(f"{key} {case[key]['median_s'] * 1e3:.3f} ms")
    for key in ("error", "graph_error", "attention_error", "skipped"):
        if case.get(key):
            parts.append(f"{key}: {case[key]}")
    if case.get("attention_backend"):
        parts.append(f"[{case['attention_backend']}]")
    if case.get("wall_s") is not None:
        parts.append(f"({case['wall_s']:.1f} s)")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=Path, help="from `python -m benchmarks.roofline_gpu spec`")
    parser.add_argument("out", type=Path, help="where the results go (JSON)")
    parser.add_argument("--budget-s", type=float, default=None, help="skip cases after this")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    measure(spec, args.out, args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
