"""Attention what-ifs: the same model under MHA, GQA, MQA and MLA, for the KV comparison.

Only the KV geometry changes, so the Planner page can show what each attention kind would
cost in KV bytes for a model people already know.
"""

from __future__ import annotations

from dataclasses import replace

from planner.models.arch import AttentionKind, MLAConfig, ModelArch

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
