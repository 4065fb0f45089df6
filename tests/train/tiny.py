"""A tiny random Llama (no tokenizer needed) for the trainer's tensor-level tests."""

from __future__ import annotations

import torch

from mainspring.engine.config import ModelConfig


def tiny_config(vocab: int = 64, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                context: int = 128) -> ModelConfig:
    return ModelConfig("llama", vocab, hidden, 2 * hidden, layers, heads, kv_heads, hidden // heads, context,
                       tie_word_embeddings=True)


def tiny_state(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.2

    sd = {"model.embed_tokens.weight": w(cfg.vocab_size, h), "model.norm.weight": torch.ones(h)}
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        sd.update({p + "self_attn.q_proj.weight": w(cfg.num_attention_heads * d, h),
                   p + "self_attn.k_proj.weight": w(cfg.num_key_value_heads * d, h),
                   p + "self_attn.v_proj.weight": w(cfg.num_key_value_heads * d, h),
                   p + "self_attn.o_proj.weight": w(h, cfg.num_attention_heads * d),
                   p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                   p + "mlp.down_proj.weight": w(h, i), p + "input_layernorm.weight": torch.ones(h),
                   p + "post_attention_layernorm.weight": torch.ones(h)})
    return sd
