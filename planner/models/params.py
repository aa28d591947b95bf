"""Parameters of a `ModelArch`, as tensor groups and as counts by component.

A decoder layer is a tuple of `Tensor` groups (dense or MoE feed-forward), the edges are
the embeddings, vision tower, final norm and LM head. `layer_kinds` is the one place that
splits layers into MoE and dense, so parameter counts and weight bytes (whole model or one
pipeline stage) always agree on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from planner.models.arch import ModelArch


@dataclass(frozen=True, slots=True)
class Tensor:
    """A group of parameters that share a dtype treatment and a tensor-parallel split.

    shard: "tp" (split across TP ranks), "kv" (split per KV head, replicated when there
    are fewer KV heads than ranks), "replicated", or "vocab" (vocab-parallel, padded).
    """

    component: str
    params: int
    linear: bool
    in_features: int = 0
    shard: str = "tp"


def _linear(component: str, fan_in: int, fan_out: int, shard: str = "tp") -> Tensor:
    """A projection matrix: quantizable, its fan-in sets per-channel scale counts."""
    return Tensor(component, fan_in * fan_out, True, fan_in, shard)


def _other(component: str, params: int, shard: str = "replicated") -> Tensor:
    """Biases, norms, embeddings: never quantized, so no fan-in is needed."""
    return Tensor(component, params, False, 0, shard)


def lm_head_tensor(arch: ModelArch) -> Tensor:
    """The LM head (vocab-parallel); a separate copy of a tied embedding loads one too."""
    return Tensor("lm_head", arch.vocab_size * arch.hidden_size, False, 0, "vocab")


def _attention_tensors(arch: ModelArch) -> list[Tensor]:
    h = arch.hidden_size
    out: list[Tensor] = []
    if arch.mla is not None:
        m = arch.mla
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            out += [
                _linear("attention", h, m.q_lora_rank, "replicated"),
                _other("norms", m.q_lora_rank),
                _linear("attention", m.q_lora_rank, arch.num_attention_heads * qk_head),
            ]
        else:
            out.append(_linear("attention", h, arch.num_attention_heads * qk_head))
        out += [
            _linear("attention", h, m.kv_lora_rank + m.qk_rope_head_dim, "replicated"),
            _other("norms", m.kv_lora_rank),
            _linear(
                "attention",
                m.kv_lora_rank,
                arch.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim),
            ),
            _linear("attention", arch.num_attention_heads * m.v_head_dim, h),
        ]
        return out
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_kv_heads * arch.head_dim
    out += [_linear("attention", h, q), _linear("attention", h, 2 * kv, "kv")]
    out.append(_linear("attention", q, h))
    if arch.qkv_bias:
        out += [_other("attention", q, "tp"), _other("attention", 2 * kv, "kv")]
    if arch.o_bias:
        out.append(_other("attention", h))
    if arch.qk_norm:
        out.append(_other("norms", 2 * arch.head_dim))
    return out


def _gated_mlp(component: str, hidden: int, inter: int, bias: bool) -> list[Tensor]:
    out = [_linear(component, hidden, 2 * inter), _linear(component, inter, hidden)]
    if bias:
        out += [_other(component, 2 * inter, "tp"), _other(component, hidden)]
    return out


def layer_tensors(arch: ModelArch, moe_layer: bool) -> tuple[Tensor, ...]:
    """The parameters of one decoder layer (dense or MoE feed-forward)."""
    # A typed front for the cached builder (functools.cache erases the signature).
    return _layer_tensors(arch, moe_layer)


@cache
def _layer_tensors(arch: ModelArch, moe_layer: bool) -> tuple[Tensor, ...]:
    h = arch.hidden_size
    out = _attention_tensors(arch)
    out.append(_other("norms", arch.norms_per_layer * h))
    moe = arch.moe
    if moe_layer and moe is not None:
        out.append(_linear("router", h, moe.num_experts, "replicated"))
        if moe.router_bias:
            out.append(_other("router", moe.num_experts))
        # Experts: gate+up and down of every expert, split across TP ranks like a dense MLP.
        out += [
            Tensor("experts", moe.num_experts * h * 2 * moe.expert_intermediate_size, True, h),
            Tensor(
                "experts",
                moe.num_experts * moe.expert_intermediate_size * h,
                True,
                moe.expert_intermediate_size,
            ),
        ]
        if moe.shared_intermediate_size:
            out += _gated_mlp("shared_experts", h, moe.shared_intermediate_size, False)
        if moe.shared_expert_gate:
            out.append(_linear("router", h, 1, "replicated"))
    else:
        out += _gated_mlp("mlp", h, arch.intermediate_size, arch.mlp_bias)
    return tuple(out)


def is_moe_layer(arch: ModelArch, index: int) -> bool:
    """Whether decoder layer `index` has a sparse (MoE) feed-forward block."""
    return arch.moe is not None and index in _moe_layer_set(arch)


@cache
def _moe_layer_set(arch: ModelArch) -> frozenset[int]:
    """MoE layer indices as a set, built once per architecture for per-layer lookups."""
    return frozenset(arch.moe.moe_layers) if arch.moe is not None else frozenset()


def layer_kinds(
    arch: ModelArch, layers: range | None = None
) -> tuple[tuple[tuple[Tensor, ...], int], ...]:
    """Decoder layers (default: all) as (one layer's tensors, how many such layers), MoE first.

    Layers of one kind are identical, so callers multiply once per kind instead of once
    per layer; a kind with no layers is left out.
    """
    span = range(arch.num_layers) if layers is None else layers
    moe = sum(1 for i in span if is_moe_layer(arch, i))
    kinds = ((True, moe), (False, len(span) - moe))
    return tuple((layer_tensors(arch, is_moe), count) for is_moe, count in kinds if count)


def edge_tensors(arch: ModelArch) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Parameters outside the decoder layers: (first stage, last stage)."""
    first = [Tensor("embedding", arch.vocab_size * arch.hidden_size, False, 0, "vocab")]
    if arch.vision_params:
        first.append(_other("vision", arch.vision_params))
    last = [_other("norms", arch.hidden_size)]
    if not arch.tie_word_embeddings:
        last.append(lm_head_tensor(arch))
    return tuple(first), tuple(last)


@dataclass(frozen=True, slots=True)
class ParamCount:
    """Parameters by component; `total` is what a checkpoint holds (tied weights once)."""

    embedding: int
    lm_head: int
    attention: int
    mlp: int
    experts: int
    shared_experts: int
    router: int
    norms: int
    vision: int

    @property
    def total(self) -> int:
        """All parameters."""
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.mlp
            + self.experts
            + self.shared_experts
            + self.router
            + self.norms
            + self.vision
        )

    def active(self, arch: ModelArch) -> int:
        """Parameters touched per token (only the routed experts a token uses)."""
        if arch.moe is None or not arch.moe.num_experts:
            return self.total
        routed = self.experts * arch.moe.experts_per_token // arch.moe.num_experts
        return self.total - self.experts + routed


@cache
def param_count(arch: ModelArch) -> ParamCount:
    """Count parameters by component from the architecture (exact for the known families)."""
    sums: dict[str, int] = dict.fromkeys(
        (
            "embedding",
            "lm_head",
            "attention",
            "mlp",
            "experts",
            "shared_experts",
            "router",
            "norms",
            "vision",
        ),
        0,
    )
    for tensors, count in layer_kinds(arch):
        for t in tensors:
            sums[t.component] += t.params * count
    first, last = edge_tensors(arch)
    for t in (*first, *last):
        sums[t.component] += t.params
    return ParamCount(**sums)
