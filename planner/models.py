"""Model architectures from Hugging Face config.json files, presets, and parameter counts.

`ModelArch` is the planner's frozen view of a config: attention geometry (MHA/GQA/MQA/MLA,
explicit head_dim), per-layer sliding windows as vLLM applies them, MoE layout, tied
embeddings. Parameter counts and weight bytes per weight dtype are derived from it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from planner.errors import InvalidInput, UnknownChoice

DATA_DIR = Path(__file__).resolve().parent / "data"
# vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to a multiple of 64.
VOCAB_PADDING = 64
# Group size assumed for int4 weights when the config does not say (GPTQ/AWQ default).
DEFAULT_INT4_GROUP = 128
# Keys vLLM reads (min over those present) to derive the model's maximum length.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# Defaults of transformers config classes for keys the published files may omit.
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
        "head_dim": 256,
        "num_key_value_heads": 4,
    },
}
_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text", "gemma3")
_QKV_BIAS_TYPES = ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
_QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3_text", "gemma3")
_FOUR_NORM_TYPES = ("gemma2", "gemma3_text", "gemma3")
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


# ---------------------------------------------------------------------------------------
# Parsing config.json
# ---------------------------------------------------------------------------------------


def _get(cfg: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return None


def _int(cfg: Mapping[str, Any], what: str, *keys: str, default: int | None = None) -> int:
    value = _get(cfg, *keys)
    if value is None:
        if default is not None:
            return default
        raise InvalidInput(f"config.json has no {what} (expected key {keys[0]!r})")
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise InvalidInput(f"config.json: {keys[0]} must be an integer, got {value!r}")
    if int(value) <= 0:
        raise InvalidInput(f"config.json: {keys[0]} must be positive, got {value!r}")
    return int(value)


def _layer_windows(cfg: Mapping[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    """Sliding window per layer, the way vLLM's model code assigns it."""
    window = _get(cfg, "sliding_window")
    if cfg.get("use_sliding_window") is False:
        # Qwen2/Qwen3: transformers sets sliding_window to None when this is off.
        return ()
    if window is None:
        return ()
    window = int(window)
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) >= layers:
        return tuple(window if t == "sliding_attention" else None for t in types[:layers])
    if model_type == "gemma2":
        # Gemma-2 alternates: even layers local (sliding), odd layers global.
        return tuple(window if i % 2 == 0 else None for i in range(layers))
    if model_type in ("gemma3_text", "gemma3"):
        pattern = int(_get(cfg, "sliding_window_pattern") or 6)
        return tuple(window if (i + 1) % pattern else None for i in range(layers))
    if cfg.get("use_sliding_window") is True and "max_window_layers" in cfg:
        first = int(cfg["max_window_layers"])
        return tuple(window if i >= first else None for i in range(layers))
    # Mistral-7B-v0.1, Phi-3: one model-level window that vLLM applies to every layer.
    return (window,) * layers


def _moe(cfg: Mapping[str, Any], layers: int) -> MoEConfig | None:
    experts = _get(cfg, "num_local_experts", "n_routed_experts", "num_experts")
    if not experts:
        return None
    experts = int(experts)
    per_token = int(_get(cfg, "num_experts_per_tok", "top_k") or 2)
    expert_inter = int(_get(cfg, "moe_intermediate_size", "intermediate_size") or 0)
    if "n_routed_experts" in cfg:  # DeepSeek: dense first layers, then every freq-th layer
        first = int(cfg.get("first_k_dense_replace") or 0)
        freq = int(cfg.get("moe_layer_freq") or 1)
        moe_layers = tuple(i for i in range(layers) if i >= first and i % freq == 0)
        shared = int(cfg.get("n_shared_experts") or 0)
        return MoEConfig(
            num_experts=experts,
            experts_per_token=per_token,
            expert_intermediate_size=expert_inter,
            num_shared_experts=shared,
            shared_intermediate_size=shared * expert_inter,
            moe_layers=moe_layers,
            router_bias=cfg.get("topk_method") == "noaux_tc",
        )
    if "num_experts" in cfg and "num_local_experts" not in cfg:  # Qwen2-MoE / Qwen3-MoE
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = tuple(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
        return MoEConfig(
            num_experts=experts,
            experts_per_token=per_token,
            expert_intermediate_size=expert_inter,
            num_shared_experts=1 if shared_inter else 0,
            shared_intermediate_size=shared_inter,
            moe_layers=moe_layers,
            shared_expert_gate=bool(shared_inter),
        )
    return MoEConfig(  # Mixtral: every layer is a sparse block
        num_experts=experts,
        experts_per_token=per_token,
        expert_intermediate_size=expert_inter,
        moe_layers=tuple(range(layers)),
    )


def _quant(cfg: Mapping[str, Any]) -> WeightQuant | None:
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        block = q.get("weight_block_size") or [128, 128]
        return WeightQuant(dtype="fp8", group_size=int(block[0]) * int(block[-1]), method=method)
    bits = q.get("bits") or q.get("w_bit")
    if method in ("awq", "gptq", "marlin", "awq_marlin", "gptq_marlin") and bits in (4, 8):
        group = int(q.get("group_size") or q.get("q_group_size") or DEFAULT_INT4_GROUP)
        return WeightQuant(dtype="int4" if bits == 4 else "int8", group_size=group, method=method)
    return None


def _siglip_params(vision: Mapping[str, Any]) -> int:
    """Parameters of a SigLIP vision tower (as used by Gemma-3), biases included."""
    h = int(vision.get("hidden_size", 1152))
    inter = int(vision.get("intermediate_size", 4304))
    layers = int(vision.get("num_hidden_layers", 27))
    patch = int(vision.get("patch_size", 14))
    image = int(vision.get("image_size", 896))
    channels = int(vision.get("num_channels", 3))
    patch_embed = channels * patch * patch * h + h
    positions = (image // patch) ** 2 * h
    per_layer = 4 * (h * h + h) + 2 * (2 * h) + (h * inter + inter) + (inter * h + h)
    return patch_embed + positions + layers * per_layer + 2 * h


def from_config_dict(
    cfg: Mapping[str, Any], name: str | None = None, source: str = ""
) -> ModelArch:
    """Build a ModelArch from the contents of a Hugging Face config.json."""
    if not isinstance(cfg, Mapping):
        raise InvalidInput("config.json must hold a JSON object at the top level")
    try:
        return _from_config(cfg, name, source)
    except (TypeError, ValueError, KeyError, IndexError) as err:
        # A field of the wrong type deep in an uploaded file: refuse it in one line.
        raise InvalidInput(
            f"config.json has a field of an unexpected type or shape: {err}"
        ) from None


def _from_config(cfg: Mapping[str, Any], name: str | None, source: str) -> ModelArch:
    notes: list[str] = []
    text_cfg = cfg.get("text_config") or cfg.get("language_config") or cfg.get("llm_config")
    top_type = str(cfg.get("model_type") or "")
    text: dict[str, Any]
    if isinstance(text_cfg, Mapping):
        text_type = str(text_cfg.get("model_type") or top_type)
        text = {**_TYPE_DEFAULTS.get(text_type, {}), **text_cfg}
        for key in ("torch_dtype", "dtype", "quantization_config"):
            if key not in text and key in cfg:
                text[key] = cfg[key]
    else:
        text = {**_TYPE_DEFAULTS.get(top_type, {}), **cfg}
    model_type = str(text.get("model_type") or top_type or "unknown")

    hidden = _int(text, "hidden size", "hidden_size", "n_embd", "d_model")
    layers = _int(text, "layer count", "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(text, "attention head count", "num_attention_heads", "n_head", "num_heads")
    kv_heads = _int(
        text,
        "KV head count",
        "num_key_value_heads",
        "num_kv_heads",
        "n_head_kv",
        default=1 if text.get("multi_query") else heads,
    )
    if heads % kv_heads:
        raise InvalidInput(
            f"config.json: num_attention_heads {heads} is not a multiple of "
            f"num_key_value_heads {kv_heads}"
        )
    head_dim = _int(text, "head_dim", "head_dim", default=hidden // heads)
    vocab = _int(text, "vocab size", "vocab_size", "padded_vocab_size")
    lengths = [int(text[k]) for k in _MAX_LEN_KEYS if isinstance(text.get(k), int | float)]
    if not lengths:
        raise InvalidInput("config.json has no max_position_embeddings (or another length key)")
    moe = _moe(text, layers)
    inter_default = 4 * hidden
    intermediate = _int(
        text, "intermediate size", "intermediate_size", "n_inner", "ffn_dim", default=inter_default
    )
    if _get(text, "intermediate_size", "n_inner", "ffn_dim") is None and moe is None:
        notes.append("no intermediate_size in the config: 4 x hidden_size assumed")

    mla = None
    if _get(text, "kv_lora_rank") is not None:
        mla = MLAConfig(
            kv_lora_rank=_int(text, "kv_lora_rank", "kv_lora_rank"),
            qk_rope_head_dim=_int(text, "qk_rope_head_dim", "qk_rope_head_dim"),
            qk_nope_head_dim=_int(text, "qk_nope_head_dim", "qk_nope_head_dim"),
            v_head_dim=_int(text, "v_head_dim", "v_head_dim"),
            q_lora_rank=int(text["q_lora_rank"]) if text.get("q_lora_rank") else None,
        )
        if text.get("num_nextn_predict_layers"):
            notes.append(
                "multi-token-prediction layers are not counted: vLLM loads them only for "
                "speculative decoding"
            )
    dtype_raw = str(_get(text, "dtype", "torch_dtype") or "float32").lower()
    dtype = DTYPE_ALIASES.get(dtype_raw.removeprefix("torch."), "bfloat16")
    if model_type not in _KNOWN_TYPES:
        notes.append(
            f"model_type {model_type!r} is not one the planner knows: parameters assume a "
            "Llama-style block (gated MLP, two norms per layer); KV figures need only the "
            "attention geometry and hold"
        )
    vision = cfg.get("vision_config")
    vision_params = 0
    if isinstance(vision, Mapping):
        if str(vision.get("model_type", "")).startswith("siglip"):
            # Gemma-3's projector: one hidden x text-hidden matrix plus an RMSNorm.
            vh = int(vision.get("hidden_size", 1152))
            vision_params = _siglip_params(vision) + vh * hidden + vh
        else:
            notes.append("vision tower not counted (only SigLIP towers are modelled)")
    return ModelArch(
        name=name or str(cfg.get("_name_or_path") or cfg.get("_hf_id") or model_type),
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=min(lengths),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        config_dtype=dtype,
        qkv_bias=bool(text.get("attention_bias", model_type in _QKV_BIAS_TYPES)),
        o_bias=bool(text.get("attention_bias", False)),
        mlp_bias=bool(text.get("mlp_bias", False)),
        qk_norm=model_type in _QK_NORM_TYPES,
        norms_per_layer=4 if model_type in _FOUR_NORM_TYPES else 2,
        mla=mla,
        moe=moe,
        layer_windows=_layer_windows(text, model_type, layers),
        vision_params=vision_params,
        quant=_quant(text),
        source=source or str(cfg.get("_source", "")),
        notes=tuple(notes),
    )


_KNOWN_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "phi3",
        "deepseek_v2",
        "deepseek_v3",
    }
)


def parse_config_json(text: str | bytes, name: str | None = None) -> ModelArch:
    """Parse the text of a config.json (e.g. an uploaded file) into a ModelArch."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise InvalidInput(f"config.json is not valid JSON: {err}") from None
    return from_config_dict(data, name=name)


def from_config_file(path: str | Path) -> ModelArch:
    """Read a config.json from disk (or a model directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise InvalidInput(f"cannot read {p}: {err.strerror or err}") from None
    return parse_config_json(text, name=p.parent.name if p.name == "config.json" else p.stem)


# ---------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------


@cache
def _preset_files() -> dict[str, str]:
    # Read next to this file rather than through importlib.resources, which fails when an
    # editable install exposes `planner` as a namespace package.
    return {
        entry.stem: entry.read_text(encoding="utf-8")
        for entry in sorted((DATA_DIR / "models").glob("*.json"))
    }


def preset_names() -> list[str]:
    """Names of the built-in presets (e.g. 'llama-3.1-8b'), sorted."""
    return sorted(_preset_files())


def preset_config(name: str) -> dict[str, Any]:
    """The raw published config.json of a preset (with its _source key); a fresh copy."""
    files = _preset_files()
    key = _resolve_preset(name)
    data: dict[str, Any] = json.loads(files[key])
    return data


def _resolve_preset(name: str) -> str:
    files = _preset_files()
    wanted = name.strip().lower()
    if wanted in files:
        return wanted
    for key, text in files.items():
        hf_id = str(json.loads(text).get("_hf_id", "")).lower()
        if wanted in (hf_id, hf_id.split("/")[-1]):
            return key
    raise UnknownChoice("model preset", name, [*files, "<path to config.json>"])


@cache
def load_preset(name: str) -> ModelArch:
    """Load a built-in preset by name or by its Hugging Face id (case-insensitive)."""
    key = _resolve_preset(name)
    return from_config_dict(preset_config(key), name=key)


def load_model(spec: str) -> ModelArch:
    """A preset name, a Hugging Face id of a preset, or a path to a config.json."""
    path = Path(spec).expanduser()
    if spec.endswith(".json") or path.is_dir() or path.is_file():
        if not path.exists():
            raise InvalidInput(f"no such config file: {spec}")
        return from_config_file(path)
    return load_preset(spec)


# ---------------------------------------------------------------------------------------
# Parameter counts
# ---------------------------------------------------------------------------------------


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
    return Tensor(component, fan_in * fan_out, True, fan_in, shard)


def _other(component: str, params: int, shard: str = "replicated") -> Tensor:
    return Tensor(component, params, False, 0, shard)


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
    return frozenset(arch.moe.moe_layers) if arch.moe is not None else frozenset()


def edge_tensors(arch: ModelArch) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Parameters outside the decoder layers: (first stage, last stage)."""
    first = [Tensor("embedding", arch.vocab_size * arch.hidden_size, False, 0, "vocab")]
    if arch.vision_params:
        first.append(_other("vision", arch.vision_params))
    last = [_other("norms", arch.hidden_size)]
    if not arch.tie_word_embeddings:
        last.append(Tensor("lm_head", arch.vocab_size * arch.hidden_size, False, 0, "vocab"))
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
    moe_layers = len(_moe_layer_set(arch))
    for is_moe, count in ((True, moe_layers), (False, arch.num_layers - moe_layers)):
        if count:
            for t in _layer_tensors(arch, is_moe):
                sums[t.component] += t.params * count
    first, last = edge_tensors(arch)
    for t in (*first, *last):
        sums[t.component] += t.params
    return ParamCount(**sums)


# ---------------------------------------------------------------------------------------
# Weight bytes
# ---------------------------------------------------------------------------------------

WEIGHT_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8", "int8", "int4")
_WEIGHT_ALIASES = {
    **DTYPE_ALIASES,
    "fp8": "fp8",
    "float8": "fp8",
    "int8": "int8",
    "w8a8": "int8",
    "int4": "int4",
    "w4a16": "int4",
    "auto": "auto",
}
_FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def served_dtype(arch: ModelArch, model_dtype: str = "auto") -> str:
    """The dtype vLLM runs the model in: `--dtype auto` serves float32 checkpoints in bf16."""
    wanted = DTYPE_ALIASES.get(model_dtype.lower()) if model_dtype != "auto" else None
    if model_dtype != "auto" and wanted is None:
        raise UnknownChoice("model dtype", model_dtype, ["auto", "bfloat16", "float16", "float32"])
    if wanted:
        return wanted
    return "bfloat16" if arch.config_dtype == "float32" else arch.config_dtype


def resolve_weight_dtype(arch: ModelArch, weights_dtype: str, model_dtype: str = "auto") -> str:
    """Normalise a weight dtype; 'auto' is the checkpoint's quantization or the served dtype."""
    key = _WEIGHT_ALIASES.get(weights_dtype.strip().lower())
    if key is None:
        raise UnknownChoice("weights dtype", weights_dtype, WEIGHT_DTYPES)
    if key == "auto":
        return arch.quant.dtype if arch.quant is not None else served_dtype(arch, model_dtype)
    return key


def _tensor_bytes(t: Tensor, params: int, dtype: str, float_bytes: int, group: int) -> float:
    """Bytes of `params` parameters of tensor group `t` stored as `dtype`."""
    if dtype in _FLOAT_BYTES:
        # Unquantized: every parameter in the weight dtype.
        return params * _FLOAT_BYTES[dtype]
    if not t.linear:
        # Quantized checkpoints keep embeddings, norms and routers in the model dtype.
        return params * float_bytes
    if dtype == "fp8":
        # One byte per weight plus an fp32 scale per 128x128 block (DeepSeek-style fp8).
        return params + params / group * 4
    if dtype == "int8":
        # One byte per weight plus an fp32 scale per output channel (W8A8 per-channel).
        return params + params / max(t.in_features, 1) * 4
    # int4: two weights per byte plus one fp16 scale per group of `group` input weights
    # (symmetric GPTQ/AWQ-style; zero points, where a format has them, are not counted).
    return params / 2 + params / group * 2


def shard_params(arch: ModelArch, t: Tensor, tp: int) -> int:
    """Parameters of tensor group `t` held by one of `tp` tensor-parallel ranks."""
    if t.shard == "replicated" or tp == 1:
        return t.params
    if t.shard == "kv":
        per_rank = max(1, arch.num_kv_heads // tp)
        return t.params * per_rank // arch.num_kv_heads
    if t.shard == "vocab":
        padded = math.ceil(arch.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
        return math.ceil(padded / tp) * (t.params // arch.vocab_size)
    return math.ceil(t.params / tp)


def tensors_bytes(
    arch: ModelArch,
    tensors: tuple[Tensor, ...],
    weights_dtype: str,
    model_dtype: str,
    tp: int = 1,
) -> float:
    """Bytes of a set of tensor groups on one TP rank (weights_dtype already resolved)."""
    float_bytes = _FLOAT_BYTES[model_dtype]
    group = _group_size(arch, weights_dtype)
    return sum(
        _tensor_bytes(t, shard_params(arch, t, tp), weights_dtype, float_bytes, group)
        for t in tensors
    )


def _group_size(arch: ModelArch, dtype: str) -> int:
    if arch.quant is not None and arch.quant.dtype == dtype:
        return arch.quant.group_size
    return 128 * 128 if dtype == "fp8" else DEFAULT_INT4_GROUP


def weight_bytes(arch: ModelArch, weights_dtype: str = "auto", model_dtype: str = "auto") -> int:
    """Bytes of all weights of one full copy of the model (no tensor or pipeline split)."""
    served = served_dtype(arch, model_dtype)
    wdt = resolve_weight_dtype(arch, weights_dtype, model_dtype)
    moe_layers = len(_moe_layer_set(arch))
    total = 0.0
    for is_moe, count in ((True, moe_layers), (False, arch.num_layers - moe_layers)):
        if count:
            total += count * tensors_bytes(arch, _layer_tensors(arch, is_moe), wdt, served)
    first, last = edge_tensors(arch)
    total += tensors_bytes(arch, (*first, *last), wdt, served)
    return math.ceil(total)


# ---------------------------------------------------------------------------------------
# Attention variants (what-if)
# ---------------------------------------------------------------------------------------

# DeepSeek-V2/V3's latent: 512 compressed KV dims plus a 64-dim decoupled RoPE key.
MLA_LATENT = (512, 64)


def attention_variants(arch: ModelArch) -> dict[str, ModelArch]:
    """The same model with MHA, GQA (8 KV heads), MQA and MLA attention, for comparison.

    Only the KV geometry changes: layers and head size stay. For an MLA model the MHA/GQA
    variants use K and V heads of qk_nope + qk_rope dims (its query/key head size).
    """
    heads = arch.num_attention_heads
    head_dim = arch.head_dim
    if arch.mla is not None:
        head_dim = arch.mla.qk_nope_head_dim + arch.mla.qk_rope_head_dim
    base = replace(arch, mla=None, head_dim=head_dim)
    gqa = arch.num_kv_heads if arch.attention_kind is AttentionKind.GQA else 8
    while heads % gqa:
        gqa -= 1
    latent, rope = MLA_LATENT
    mla = MLAConfig(
        kv_lora_rank=latent,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=head_dim,
        v_head_dim=head_dim,
        q_lora_rank=None,
    )
    return {
        f"MHA ({heads} KV heads)": replace(base, num_kv_heads=heads),
        f"GQA ({gqa} KV heads)": replace(base, num_kv_heads=gqa),
        "MQA (1 KV head)": replace(base, num_kv_heads=1),
        f"MLA (latent {latent}+{rope})": replace(arch, mla=mla, num_kv_heads=heads),
    }
