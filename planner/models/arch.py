"""The planner's frozen view of a model architecture, and the dtype spellings it accepts.

Everything else in the package reads these types; nothing here parses or counts, so the
types can be built by hand (tests, what-if variants) without a config.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# Spellings of the floating-point dtypes in configs, CLI flags and vLLM's --dtype.
DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}
# Group size assumed for int4 weights when the config does not say (GPTQ/AWQ default).
DEFAULT_INT4_GROUP = 128


class AttentionKind(StrEnum):
    """How keys and values are shared across query heads."""

    MHA = "MHA"
    GQA = "GQA"
    MQA = "MQA"
    MLA = "MLA"


@dataclass(frozen=True, slots=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): the cache holds one latent per token."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True, slots=True)
class MoEConfig:
    """Mixture-of-experts layout of the feed-forward blocks."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0
    moe_layers: tuple[int, ...] = ()
    router_bias: bool = False
    shared_expert_gate: bool = False


@dataclass(frozen=True, slots=True)
class WeightQuant:
    """Quantization the checkpoint itself declares (quantization_config)."""

    dtype: str
    group_size: int
    method: str


@dataclass(frozen=True, slots=True)
class ModelArch:
    """The planner's frozen view of one model architecture."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    config_dtype: str = "bfloat16"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    layer_windows: tuple[int | None, ...] = ()
    vision_params: int = 0
    quant: WeightQuant | None = None
    source: str = ""
    notes: tuple[str, ...] = ()

    @property
    def attention_kind(self) -> AttentionKind:
        """MHA, GQA, MQA or MLA."""
        if self.mla is not None:
            return AttentionKind.MLA
        if self.num_kv_heads == self.num_attention_heads:
            return AttentionKind.MHA
        if self.num_kv_heads == 1:
            return AttentionKind.MQA
        return AttentionKind.GQA

    @property
    def kv_heads_cached(self) -> int:
        """KV heads held in the cache per layer: one latent for MLA, num_kv_heads otherwise."""
        return 1 if self.mla is not None else self.num_kv_heads

    @property
    def kv_head_size(self) -> int:
        """Elements per cached head per token for K (and V): the latent width for MLA."""
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return self.head_dim

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Per-layer sliding window (None = full attention), one entry per layer."""
        return self.layer_windows or (None,) * self.num_layers

    @property
    def has_sliding_window(self) -> bool:
        """Whether any layer uses a sliding window."""
        return any(w is not None for w in self.windows)
