"""Llama-family causal LM (Llama, Mistral, Qwen2) over a paged KV cache.

Tokens of every sequence in a step are flattened into one batch [T]; Q/K/V and gate/up are
fused into single matmuls so a decode step is a handful of GEMMs per layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mainspring.engine.attention import AttentionMetadata, paged_attention
from mainspring.engine.config import ModelConfig
from mainspring.engine.errors import ModelLoadError
from mainspring.engine.layers import RMSNorm, RotaryEmbedding, Rotation

if TYPE_CHECKING:
    from mainspring.engine.native_ops import FusedOps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.h, self.kvh, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=cfg.attention_bias)
        # Llama's attention_bias also covers o_proj; Qwen2 biases q/k/v only
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size,
                                bias=cfg.attention_bias and cfg.architecture != "qwen2")
        self.scale = self.d**-0.5
        self.fused: FusedOps | None = None  # the engine's compiled kernels for few-row steps (engine/native_ops.py)

    def forward(self, x, rot: Rotation, kv: tuple[torch.Tensor, torch.Tensor], meta):
        t, qk_width = x.shape[0], (self.h + self.kvh) * self.d
        qkv = self.qkv_proj(x)
        v = qkv[:, qk_width:].view(t, self.kvh, self.d)
        f = self.fused
        if f is not None and f.fits(qkv) and f.fits_kv(meta.slot_mapping, kv[0], kv[1], rot.cos, rot.signed_sin):
            # RoPE and the K/V write in one kernel; paged_attention then skips its index_copy_
            qk = f.rope_write_kv(qkv, rot.cos, rot.signed_sin, meta.slot_mapping, kv[0], kv[1], self.h, self.kvh)
            o = paged_attention(qk[:, : self.h], qk[:, self.h :], v, kv, meta, self.scale, kv_written=True)
        else:
            # queries and keys are rotated together: one set of RoPE ops per layer instead of two
            qk = rot.apply(qkv[:, :qk_width].view(t, self.h + self.kvh, self.d))
            o = paged_attention(qk[:, : self.h], qk[:, self.h :], v, kv, meta, self.scale)
        return self.o_proj(o.reshape(t, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.fused: FusedOps | None = None  # the engine's compiled kernels for few-row steps (engine/native_ops.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.fused is not None and self.fused.fits(gate_up):
            return self.down_proj(self.fused.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rot: Rotation, kv, meta):
        x, h = self.post_attention_layernorm.add_forward(x, self.self_attn(self.input_layernorm(x), rot, kv, meta))
        return x + self.mlp(h)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: list, meta: AttentionMetadata,
                layers: Sequence[int] | None = None):
        """Returns final hidden states [T, hidden]; K/V of these tokens are written to kv_cache. A static
        (graph-captured) step reads no value on the host: its runner grew the RoPE table beforehand. `layers`:
        only these decoder layers, in this order (a layer-skipping draft, engine/speculative.py); None: all."""
        if meta.static is None:
            self.rope.ensure(positions if meta.max_position is None else meta.max_position)
        x = self.embed_tokens(input_ids)
        rot = self.rope.at(positions, x.dtype)  # once per forward, for every layer
        picked = zip(self.layers, kv_cache) if layers is None else ((self.layers[i], kv_cache[i]) for i in layers)
        for layer, kv in picked:
            x = layer(x, rot, kv, meta)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits in every precision (a no-op in fp32): the sampler, grammar masks and logprobs read them."""
        return self.lm_head(self.norm(hidden)).float()

    @classmethod
    def from_weights(cls, cfg: ModelConfig, state_dict: dict[str, torch.Tensor],
                     dtype: torch.dtype = torch.float32) -> "CausalLM":
        """Build without random init (meta device) and adopt the tensors: no weight is copied
        except the fused q/k/v and gate/up (and every one when `dtype` is not theirs), so the model
        costs little beyond the state dict."""
        with torch.device("meta"):
            model = cls(cfg)
        model.rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        model.load_weights(state_dict, dtype)
        return model.eval().requires_grad_(False)

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> None:
        """Adopt Hugging Face-named tensors (shared, not copied), fusing q/k/v and gate/up, in `dtype`. The RoPE
        tables stay fp32 (exact angles) and are cast per forward."""
        sd = dict(state_dict)
        fused = {}
        for i in range(self.config.num_hidden_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            fused[f"layers.{i}.self_attn.qkv_proj.weight"] = [a + n + ".weight" for n in ("q_proj", "k_proj", "v_proj")]
            if self.config.attention_bias:
                fused[f"layers.{i}.self_attn.qkv_proj.bias"] = [a + n + ".bias" for n in ("q_proj", "k_proj", "v_proj")]
            fused[f"layers.{i}.mlp.gate_up_proj.weight"] = [m + "gate_proj.weight", m + "up_proj.weight"]
        params = dict(self.named_parameters(remove_duplicate=False))
        for name, param in params.items():
            if name in fused:
                parts = [_take(sd, n) for n in fused[name]]
                value = torch.cat(parts, dim=0)
            elif name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            else:
                value = _take(sd, "model." + name if name != "lm_head.weight" else name)
            if value.shape != param.shape:
                raise ModelLoadError(f"tensor {name}: shape {tuple(value.shape)} != expected {tuple(param.shape)}")
            module, _, leaf = name.rpartition(".")
            setattr(self.get_submodule(module), leaf, nn.Parameter(value.to(dtype).contiguous(), requires_grad=False))
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.no_grad()
    def place(self, device: torch.device, dtype: torch.dtype) -> None:
        """Move to `device` and cast the dense weights (the parameters) to `dtype`, keeping tied ones tied; buffers
        keep their dtype (the RoPE tables stay fp32, quantized layers keep their packed form)."""
        self.to(device)
        cast: dict[int, nn.Parameter] = {}
        for module in self.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                if param.dtype != dtype:
                    if id(param) not in cast:
                        cast[id(param)] = nn.Parameter(param.to(dtype), requires_grad=False)
                    setattr(module, name, cast[id(param)])


def _take(sd: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in sd:
        raise ModelLoadError(f"weights are missing tensor {name!r}")
    return sd[name]
