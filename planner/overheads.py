"""vLLM's memory accounting by release: what it subtracts from `total x utilization` before
the KV cache, and how large each part is.

vLLM V1 sizes the cache as `requested - (weights + torch activation peak + non-torch
increase [+ CUDA graph estimate])` (vllm/v1/worker/gpu_worker.py,
`determine_available_memory`). The parts moved between releases: the sampler warm-up's
share of the activation peak, non-torch memory at TP >= 2, and whether the CUDA graph
estimate is subtracted (logged from 0.18, subtracted by default from 0.20.0, PR #38284).
Each `Accounting` cites where its constants come from; those fitted to published logs say
so, and tests/planner/test_ground_truth.py checks them against those logs. A release
without logs gets a range, never one number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from planner.errors import InvalidInput
from planner.memory import DEFAULT_MAX_NUM_SEQS
from planner.models import ModelArch

GIB = 1 << 30
MIB = 1 << 20

# The 75 published vLLM 0.19.0 startup logs (H100 80GB HBM3, debug logging on) that
# calibrate the 0.17-0.20 accounting; kept in tests/fixtures/vllm_startup_logs/.
LLMD_0_19 = (
    "https://github.com/llm-d-incubation/llm-d-planner/tree/"
    "d3121e059da88662db39a926a3ead964be97359b/accuracy/results/v0.19.0/logs"
)
DENNISLEE_0_10 = (
    "https://github.com/dennislee22/vLLM-benchmarking/tree/"
    "b474d1e053c35c9aef8c02aae4efbc0d8675f033/log"
)


@dataclass(frozen=True, slots=True)
class Accounting:
    """How one range of vLLM releases budgets a GPU's memory (all sizes in bytes)."""

    key: str
    first: tuple[int, ...]
    last: tuple[int, ...] | None  # inclusive; None = open
    default_gpu_memory_utilization: float
    # Activation peak = max(forward pass over max_num_batched_tokens, sampler warm-up);
    # the warm-up holds `sampler_copies` float32 [max_num_seqs, vocab] tensors (logits,
    # probabilities, the sorted copy for top-k/top-p and its int64 indices) plus a base.
    sampler_copies: float
    sampler_base: int
    non_torch_single: int
    non_torch_multi: int  # per rank at TP >= 2 (communication buffers)
    non_torch_pp: int  # per rank with PP > 1 and TP 1
    graphs_in_budget: bool
    graph_estimate: tuple[int, int, int]  # low, point, high per GPU
    calibrated: bool  # ground truth (published logs) checked in tests
    calibrated_multi_gpu: bool  # ... including starts with TP >= 2
    sources: tuple[str, ...]
    # The sampler warm-up's copies by top-k/top-p path where the release picks it by what is
    # installed (FlashInfer or PyTorch's sort), as a startup log names it; `sampler_copies`
    # is the path a plan without a log assumes.
    sampler_paths: tuple[tuple[str, float], ...] = ()

    def covers(self, version: tuple[int, ...]) -> bool:
        """Whether `version` falls in this range."""
        n = len(self.first)
        head = version[:n] + (0,) * (n - len(version[:n]))
        if head < self.first:
            return False
        return self.last is None or version[: len(self.last)] <= self.last

    @property
    def versions(self) -> str:
        """The range as people write it."""
        first = ".".join(map(str, self.first))
        if self.last is None:
            return f">= {first}"
        return f"{first} - {'.'.join(map(str, self.last))}"


V0_17 = Accounting(
    key="v0.17",
    first=(0, 17),
    last=(0, 19),
    default_gpu_memory_utilization=0.9,
    sampler_copies=3.62,
    sampler_base=round(0.16 * GIB),
    non_torch_single=round(0.26 * GIB),
    non_torch_multi=round(2.2 * GIB),
    non_torch_pp=round(0.08 * GIB),
    graphs_in_budget=False,
    graph_estimate=(round(0.5 * GIB), round(0.85 * GIB), round(1.9 * GIB)),
    calibrated=True,
    calibrated_multi_gpu=True,
    sources=(
        f"{LLMD_0_19}: 'torch peak memory increase' 1.89 GiB (Llama-3.1-8B, vocab "
        "128,256), 2.21 (Qwen2.5-7B, 152,064), 3.62-3.66 (Gemma-2, 256,000) with "
        "max_num_seqs 1024 at TP 1, 2 and 4: the sampler warm-up, 3.6 float32 copies "
        "of [max_num_seqs, vocab]; small-vocabulary models (CodeLlama 0.77, Granite "
        "0.75-0.85) are bounded by the forward pass over 8,192 tokens",
        f"{LLMD_0_19}: 'non-torch forward increase memory' 0.24-0.27 GiB at TP 1, "
        "2.06-2.21 GiB per rank at TP 2 and 4, 0.07 with PP only",
        f"{LLMD_0_19}: Available KV = 0.95 x 79.19 GiB - 'Total non KV cache memory'; "
        "the 'Estimated CUDA graph memory' (0.5-1.9 GiB) is logged, not subtracted",
        "vllm/v1/sample (0.17.0, PR #33538): top-k/top-p in place for batches of 8 or "
        "more; before, a sort-based path (5.64 GiB of activation for Qwen3-14B in "
        "0.15-0.16 against 2.23 from 0.17, llm-d-planner accuracy/results/version-sweep)",
    ),
)

# Float32 copies of the logits the sampler warm-up holds, by top-k/top-p path (sources in
# the accountings below): FlashInfer's (0.10 A100 logs), PyTorch's sort (0.11 logs).
FLASHINFER_COPIES = 1.5
SORT_COPIES = 9.5

ACCOUNTINGS: tuple[Accounting, ...] = (
    Accounting(
        key="v0.10",
        first=(0, 9),
        last=(0, 10),
        default_gpu_memory_utilization=0.9,
        sampler_copies=FLASHINFER_COPIES,
        sampler_base=round(0.12 * GIB),
        non_torch_single=round(0.2 * GIB),
        non_torch_multi=round(0.3 * GIB),
        non_torch_pp=round(0.2 * GIB),
        graphs_in_budget=False,
        graph_estimate=(round(0.4 * GIB), round(0.6 * GIB), round(2.0 * GIB)),
        calibrated=True,
        calibrated_multi_gpu=True,
        sampler_paths=(("flashinfer", FLASHINFER_COPIES), ("native", SORT_COPIES)),
        sources=(
            f"{DENNISLEE_0_10}: six 0.10.1.1 logs on A100 (Qwen2-7B TP1/TP2 at utilization 0.25 "
            "and 0.5, gpt-oss-120b TP4): weights + overheads = requested - available KV, "
            "0.49-0.64 GiB of overheads with max_num_batched_tokens 2048, max_num_seqs 256; "
            "every one of them logs 'Using FlashInfer for top-p & top-k sampling'",
            "vllm/v1/sample/ops/topk_topp_sampler.py (0.10): V1 samples top-k/top-p with "
            "FlashInfer when it is installed; without it ('FlashInfer is not available. Falling "
            "back to the PyTorch-native implementation') apply_top_k_top_p sorts the float32 "
            "logits, the path the 0.11 accounting measures (9.5 copies). The vLLM 0.10.2 start "
            "of Qwen3-235B-A22B-FP8 on 8x L40S (tim-roethig/ai-platform@8fc2c9b, "
            "platform/docs/qwen3_235b_on_8xl40s.md) logs the fallback and 1.4 GiB of peak "
            "activation; the sort path's 9.5 copies of [256, 151,936] are 1.38 GiB",
            "vllm/v1/worker/gpu_worker.py (0.10.1.1): CUDA graphs are captured after the KV "
            "cache is allocated, out of the (1 - utilization) headroom; the memory snapshot "
            "is taken before NCCL starts up to 0.10.2 (after it from 0.11.0, PR #25359)",
        ),
    ),
    Accounting(
        key="v0.11",
        first=(0, 11),
        last=(0, 16),
        default_gpu_memory_utilization=0.9,
        sampler_copies=SORT_COPIES,
        sampler_base=round(0.16 * GIB),
        non_torch_single=round(0.2 * GIB),
        non_torch_multi=round(2.2 * GIB),
        non_torch_pp=round(0.2 * GIB),
        graphs_in_budget=False,
        graph_estimate=(round(0.4 * GIB), round(0.85 * GIB), round(1.9 * GIB)),
        calibrated=True,
        calibrated_multi_gpu=False,
        sources=(
            "vllm/v1/sample (before 0.17.0, PR #33538): the sampler warm-up's top-k/top-p "
            "sorts the float32 logits (values, int64 indices, probabilities): 9.5 copies of "
            "[max_num_seqs, vocab]; llm-d-planner accuracy/results/version-sweep: Qwen3-14B "
            "activation 5.64 GiB in 0.15-0.16 (1,024 x 151,936 logits)",
            "https://github.com/abinavChandar/demo_env_l4/blob/097d5ab2cbe19e49c91325bbca531f"
            "50d76b419e/vllm.log (0.11.0, L4, max_num_seqs 128) and https://github.com/"
            "faradawn/bench3/blob/446e08ca8bba29ccab26de8ec8a8986643b0a975/logs/vllm_server.log"
            " (0.11.2, H200, max_num_seqs 1024): requested - weights - available KV matches",
            "no TP >= 2 log of these releases: non-torch per rank taken from 0.19.0",
        ),
    ),
    V0_17,
    # 0.17-0.19's activation and non-torch (no 0.20+ log with a breakdown was found); the
    # CUDA graph estimate now comes out of the budget and the default utilization rose.
    replace(
        V0_17,
        key="v0.20",
        first=(0, 20),
        last=None,
        default_gpu_memory_utilization=0.92,
        graphs_in_budget=True,
        graph_estimate=(round(0.5 * GIB), round(1.0 * GIB), round(1.9 * GIB)),
        calibrated=False,
        calibrated_multi_gpu=False,
        sources=(
            "vllm/v1/worker/gpu_worker.py (0.20.0 and 0.32.0 sources): the CUDA graph "
            "estimate is subtracted from the KV budget (VLLM_MEMORY_PROFILER_ESTIMATE_"
            "CUDAGRAPHS defaults to 1, PR #38284; the log's 'default since v0.21.0' is one "
            "release late); vllm/config/cache.py: gpu_memory_utilization defaults to 0.92",
            f"activation and non-torch as measured in 0.19.0 ({LLMD_0_19}); no published "
            "0.21+ log with a full breakdown was found, so plans give a range",
        ),
    ),
)
NEWEST = ACCOUNTINGS[-1]


def parse_version(text: str) -> tuple[int, ...]:
    """'0.19.0', 'v0.10.1.1' or '0.19.1rc1.dev329+g...' as a comparable tuple."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    if not m:
        raise InvalidInput(
            f"cannot read {text!r} as a vLLM version; write it as X.Y or X.Y.Z (e.g. 0.19.0)"
        )
    return tuple(int(g) for g in m.groups() if g is not None)


@dataclass(frozen=True, slots=True)
class AccountingChoice:
    """The accounting a plan uses, and whether the release is one the project knows."""

    accounting: Accounting
    version: str | None
    known: bool

    @property
    def label(self) -> str:
        """One line for a page or a table."""
        a = self.accounting
        asked = f"vLLM {self.version}" if self.version else "newest vLLM"
        how = "calibrated on published logs" if a.calibrated else "not checked against logs"
        tail = "" if self.known else "; unknown release, the nearest accounting, as a range"
        return f"{asked}: accounting {a.key} (releases {a.versions}, {how}){tail}"


def accounting_for(version: str | None = None) -> AccountingChoice:
    """The accounting of a vLLM release (default: the newest the project knows)."""
    if version is None or not version.strip():
        return AccountingChoice(NEWEST, None, True)
    v = parse_version(version)
    for acc in ACCOUNTINGS:
        if acc.covers(v):
            return AccountingChoice(acc, version.strip(), True)
    # Before 0.10 (V0 and early V1) or between ranges: the nearest one, flagged.
    nearest = ACCOUNTINGS[0] if v < ACCOUNTINGS[0].first else NEWEST
    for acc in ACCOUNTINGS:
        if acc.first <= v:
            nearest = acc
    return AccountingChoice(nearest, version.strip(), False)


def _expert_split(tp: int, expert_parallel: bool) -> int:
    """How many ways one expert's intermediate is split: by TP, or (expert parallelism,
    vllm/model_executor/layers/fused_moe/layer.py: each rank holds whole experts, the MoE
    layer's TP size is 1) not at all."""
    return 1 if expert_parallel else tp


def forward_activation_bytes(
    arch: ModelArch,
    served_dtype: str,
    tp: int,
    max_num_batched_tokens: int,
    expert_parallel: bool = False,
) -> int:
    """The profiling forward pass's live tensors at one decoder layer's peak.

    Per token: the residual stream, its normed copy and the attention input/output
    (4 x hidden), the fused QKV output, and the feed-forward intermediate (gate and up, or
    for MoE the fused-expert caches of the top-k experts), over max_num_batched_tokens.
    """
    elem = 4 if served_dtype == "float32" else 2
    h = arch.hidden_size
    if arch.mla is not None:
        m = arch.mla
        qkv = (
            arch.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) // tp
            + m.kv_lora_rank
            + m.qk_rope_head_dim
        )
    else:
        qkv = (arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim // tp
    ffn = 2 * arch.intermediate_size // tp
    if arch.moe is not None:
        dense_layers = arch.num_layers - len(arch.moe.moe_layers)
        split = _expert_split(tp, expert_parallel)
        per_expert = 3 * arch.moe.expert_intermediate_size // split + h
        ffn = max(ffn if dense_layers else 0, arch.moe.experts_per_token * per_expert)
    return max_num_batched_tokens * (4 * h + qkv + ffn) * elem


def moe_workspace_bytes(
    arch: ModelArch,
    served_dtype: str,
    tp: int,
    max_num_batched_tokens: int,
    expert_parallel: bool = False,
) -> int:
    """The fused-MoE kernel's intermediate caches for a full batch (gate-up output, the
    activated half, the down output, per routed expert), which stay allocated after the
    forward pass and so sit under the sampler warm-up's peak (vllm/v1/worker/gpu_worker.py
    0.32.0 on the MoE workspace; Qwen3-30B-A3B peaked 0.42 GiB above its sampler warm-up
    in 0.19.0, LLMD_0_19)."""
    if arch.moe is None:
        return 0
    elem = 4 if served_dtype == "float32" else 2
    inter = arch.moe.expert_intermediate_size // _expert_split(tp, expert_parallel)
    per_token = arch.moe.experts_per_token * (3 * inter + arch.hidden_size)
    return max_num_batched_tokens * per_token * elem


def sampler_warmup_bytes(
    acc: Accounting, arch: ModelArch, max_num_seqs: int, sampler: str | None = None
) -> int:
    """The sampler warm-up: max_num_seqs requests' float32 logits over the vocabulary and
    the copies top-k/top-p sampling makes (not split by TP: logits are gathered); `sampler`
    is the top-k/top-p path a log names ("flashinfer", "native"), None the release's usual."""
    copies = dict(acc.sampler_paths).get(sampler or "", acc.sampler_copies)
    return acc.sampler_base + round(copies * max_num_seqs * arch.vocab_size * 4)


# The vision encoder's dummy run adds to the peak of multimodal models: Gemma-3 4B/12B/27B
# peaked 0.11-0.21 GiB above their sampler warm-up in vLLM 0.19.0 (LLMD_0_19), Gemma-2 (same
# vocabulary, text only) within 0.04 GiB of it.
VISION_PROFILE = round(0.2 * GIB)


def activation_bytes(
    acc: Accounting,
    arch: ModelArch,
    served_dtype: str,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    with_sampler: bool = True,
    sampler: str | None = None,
    expert_parallel: bool = False,
) -> int:
    """Peak of the profiling run: the larger of the forward pass and the sampler warm-up
    with what the forward pass leaves allocated (the sampler runs on the last pipeline
    stage only)."""
    forward = forward_activation_bytes(
        arch, served_dtype, tp, max_num_batched_tokens, expert_parallel
    )
    vision = VISION_PROFILE if arch.vision_params else 0
    if not with_sampler:
        return forward + vision
    warmup = sampler_warmup_bytes(acc, arch, max_num_seqs, sampler) + moe_workspace_bytes(
        arch, served_dtype, tp, max_num_batched_tokens, expert_parallel
    )
    return max(forward, warmup) + vision


def non_torch_bytes(acc: Accounting, tp: int = 1, pp: int = 1) -> int:
    """Non-torch memory a worker adds while profiling: cuBLAS workspaces, and at TP >= 2
    the NCCL and custom all-reduce buffers."""
    if tp > 1:
        return acc.non_torch_multi
    return acc.non_torch_pp if pp > 1 else acc.non_torch_single


def graph_bytes(acc: Accounting, enforce_eager: bool = False, which: int = 1) -> int:
    """CUDA graph memory taken from the KV budget (0 where the release keeps it outside);
    `which` picks the low (0), point (1) or high (2) estimate."""
    if enforce_eager or not acc.graphs_in_budget:
        return 0
    return acc.graph_estimate[which]


def default_batch_limits(memory_bytes: int, gpu_name: str) -> tuple[int, int]:
    """vLLM's online-serving defaults (max_num_batched_tokens, max_num_seqs) for a GPU
    (vllm/engine/arg_utils.py `get_batch_defaults`, 0.32.0; the same split since 0.10:
    large defaults from 70 GiB, except on A100)."""
    if memory_bytes >= 160 * GIB:
        return 16384, 1024
    if memory_bytes >= 70 * GIB and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, DEFAULT_MAX_NUM_SEQS


# How far off an accounting may be where nothing checked it: activation and non-torch
# scaled by these for the optimistic (0) and pessimistic (2) ends of a range.
UNSURE_SCALE = (0.75, 1.0, 1.5)
# Across nodes NCCL adds network-transport buffers no calibrated log measures; the one
# two-node log in the fixture (0.10.1.1, A100 40GB, TP2 over Ray) lost 1.0 GiB more per
# rank than the same-node runs. The pessimistic end of a multi-node plan adds this.
MULTI_NODE_NON_TORCH = round(1.5 * GIB)


@dataclass(frozen=True, slots=True)
class Overheads:
    """One GPU's non-weight, non-KV memory as vLLM counts it, in bytes."""

    activation: int
    non_torch: int
    cuda_graphs: int


def overheads(
    choice: AccountingChoice,
    arch: ModelArch,
    served_dtype: str,
    tp: int,
    pp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    last_stage: bool,
    enforce_eager: bool,
    which: int = 1,
    unsure: bool = False,
    nodes: int = 1,
    sampler: str | None = None,
    expert_parallel: bool = False,
) -> Overheads:
    """The overheads of one pipeline stage's GPU: the point estimate (which=1), or the
    optimistic (0) / pessimistic (2) end when the planner is unsure. An unknown release
    spans every accounting."""
    pool = ACCOUNTINGS if not choice.known else (choice.accounting,)
    parts = [
        Overheads(
            activation_bytes(
                acc,
                arch,
                served_dtype,
                tp,
                max_num_batched_tokens,
                max_num_seqs,
                last_stage,
                sampler,
                expert_parallel,
            ),
            non_torch_bytes(acc, tp, pp),
            graph_bytes(acc, enforce_eager, which),
        )
        for acc in pool
    ]
    pick = max if which == 2 else min if which == 0 else (lambda xs: xs[0])
    scale = UNSURE_SCALE[which] if unsure else 1.0
    graphs = pick([p.cuda_graphs for p in parts])
    if which == 2 and not enforce_eager and not choice.known:
        graphs = max(acc.graph_estimate[2] for acc in pool)
    extra = MULTI_NODE_NON_TORCH if which == 2 and nodes > 1 else 0
    return Overheads(
        activation=round(pick([p.activation for p in parts]) * scale),
        non_torch=round(pick([p.non_torch for p in parts]) * scale) + extra,
        cuda_graphs=graphs,
    )
