"""Model architectures: the frozen `ModelArch`, parsed from a Hugging Face config.json or a
built-in preset, with its parameter counts, weight bytes and attention what-ifs.

arch (the types), config (parsing), presets (packaged configs), params (tensor groups and
counts), weights (bytes per dtype, rank and stage), variants (MHA/GQA/MQA/MLA). Import from
here; the modules are the layout, this is the surface.
"""

from planner.models.arch import (
    DEFAULT_INT4_GROUP,
    DTYPE_ALIASES,
    AttentionKind,
    MLAConfig,
    ModelArch,
    MoEConfig,
    WeightQuant,
)
from planner.models.config import from_config_dict, from_config_file, parse_config_json
from planner.models.params import (
    ParamCount,
    Tensor,
    edge_tensors,
    is_moe_layer,
    layer_kinds,
    layer_tensors,
    lm_head_tensor,
    param_count,
)
from planner.models.presets import load_model, load_preset, preset_config, preset_names
from planner.models.variants import MLA_LATENT, attention_variants
from planner.models.weights import (
    VOCAB_PADDING,
    WEIGHT_DTYPES,
    layers_bytes,
    resolve_weight_dtype,
    served_dtype,
    shard_params,
    stage_weight_bytes,
    tensors_bytes,
    weight_bytes,
)

__all__ = [
    "DEFAULT_INT4_GROUP",
    "DTYPE_ALIASES",
    "MLA_LATENT",
    "VOCAB_PADDING",
    "WEIGHT_DTYPES",
    "AttentionKind",
    "MLAConfig",
    "MoEConfig",
    "ModelArch",
    "ParamCount",
    "Tensor",
    "WeightQuant",
    "attention_variants",
    "edge_tensors",
    "from_config_dict",
    "from_config_file",
    "is_moe_layer",
    "layer_kinds",
    "layer_tensors",
    "layers_bytes",
    "lm_head_tensor",
    "load_model",
    "load_preset",
    "param_count",
    "parse_config_json",
    "preset_config",
    "preset_names",
    "resolve_weight_dtype",
    "served_dtype",
    "shard_params",
    "stage_weight_bytes",
    "tensors_bytes",
    "weight_bytes",
]
