"""Tiny synthetic GGUF files (written with gguf-py, the way llama.cpp's converter lays them out) and
transformers' GGUF loader as an oracle; shared by the loader tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from mainspring.engine import gguf_convert

Q = gguf.GGMLQuantizationType


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q/k rows (the transform we must undo)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def transformers_gguf(path: Path) -> tuple[object, dict[str, torch.Tensor]]:
    """(config, state dict) as transformers' GGUF loader builds them.

    `from_pretrained(gguf_file=...)` insists on `accelerate`, which this venv lacks; it delegates to
    `load_gguf_checkpoint` (dequantize, un-permute, rename), so call that with a meta-device model.
    """
    pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return config, load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_CHARS = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + [chr(c) for c in range(174, 256)]
BYTE_CHARS += [chr(256 + i) for i in range(256 - len(BYTE_CHARS))]
TOKENS = SPECIALS + BYTE_CHARS + ["he", "ll", "Ġw"]
MERGES = ["h e", "l l", "Ġ w"]
DIMS = dict(hidden=64, heads=4, kv=2, head_dim=16, inter=96, layers=2)


def tiny_weights(arch: str, seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
    """HF-named fp32 weights of a tiny llama/qwen2."""
    rng = np.random.default_rng(seed)
    h, q, kv, f = DIMS["hidden"], DIMS["heads"] * DIMS["head_dim"], DIMS["kv"] * DIMS["head_dim"], DIMS["inter"]
    w = {"model.embed_tokens.weight": (len(TOKENS), h), "model.norm.weight": (h,)}
    if not tied:
        w["lm_head.weight"] = (len(TOKENS), h)
    for i in range(DIMS["layers"]):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
              p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
              p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
              p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f)}
        if arch == "qwen2":
            w |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                  p + "self_attn.v_proj.bias": (kv,)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in w.items()}


GGUF_NAMES = {v: k for k, v in gguf_convert._GLOBAL_NAMES.items()}


def to_gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, i, *rest = hf.split(".")
    mod, kind = ".".join(rest[:-1]), rest[-1]
    short = {v: k for k, v in gguf_convert._LAYER_NAMES.items()}[mod]
    return f"blk.{i}.{short}.{kind}"


def write_tiny_gguf(path: Path, arch: str, weights: dict[str, np.ndarray], quant: dict[str, Q] | None = None,
                    extra_tensors: dict[str, np.ndarray] | None = None, **meta) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(meta.get("name", "tiny"))
    w.add_block_count(DIMS["layers"])
    w.add_context_length(256)
    w.add_embedding_length(DIMS["hidden"])
    w.add_feed_forward_length(DIMS["inter"])
    w.add_head_count(DIMS["heads"])
    w.add_head_count_kv(DIMS["kv"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(meta.get("rope_theta", 10000.0))
    if arch == "llama":
        w.add_rope_dimension_count(DIMS["head_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(meta.get("pre", "default"))
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if meta.get("add_bos"):
        w.add_add_bos_token(True)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}")
    for hf, arr in weights.items():
        if arch == "llama" and (".q_proj." in hf or ".k_proj." in hf):
            arr = llamacpp_permute(arr, DIMS["heads"] if ".q_proj." in hf else DIMS["kv"])
        qt = (quant or {}).get(hf)
        if qt is None:
            w.add_tensor(to_gguf_name(hf), np.ascontiguousarray(arr))
        else:
            w.add_tensor(to_gguf_name(hf), gguf.quants.quantize(np.ascontiguousarray(arr), qt), raw_dtype=qt)
    for name, arr in (extra_tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
