"""Parsing a Hugging Face config.json into a `ModelArch`, the way vLLM reads the same keys.

Text-only and multimodal layouts (text_config), transformers' defaults for keys published
files omit, per-layer sliding windows, MoE layouts, a checkpoint's own quantization, and
Gemma-3's SigLIP vision tower. Anything malformed is refused as `InvalidInput`, in one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.errors import InvalidInput
from planner.models.arch import (
    DEFAULT_INT4_GROUP,
    DTYPE_ALIASES,
    MLAConfig,
    ModelArch,
    MoEConfig,
    WeightQuant,
)

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
# Families whose parameter layout the planner models exactly; others get a note.
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


def _get(cfg: Mapping[str, Any], *keys: str) -> Any:
    """The first non-null value among the spellings families use for one field."""
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return None


def _int(cfg: Mapping[str, Any], what: str, *keys: str, default: int | None = None) -> int:
    """A positive integer field, or a one-line refusal that names it."""
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
