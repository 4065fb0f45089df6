"""GGUF file -> Hugging Face folder (config.json, fp32 model.safetensors, tokenizer files).

We dequantize once and cache the folder, so every later start is a plain safetensors load (~1 s)
instead of a GGUF parse plus dequantization, and the model code only knows HF tensor names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .config import SUPPORTED_ARCHITECTURES
from .errors import ModelLoadError, UnsupportedModelError
from .gguf_vocab import build_gguf_tokenizer

# Bump when the folder layout or any conversion rule changes: it is part of the cache key.
CONVERTER_VERSION = 1

_HF_CLASS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# The quant types gguf-py can dequantize (gguf 0.19); anything else (I8/I32/F64/Q8_K...) is refused up front.
_DEQUANTIZABLE = frozenset(
    "F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S "
    "IQ1_S IQ1_M IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4 NVFP4".split()
)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_tensor_name(gguf_name: str) -> str | None:
    """llama.cpp tensor name -> Hugging Face name, or None when we have no mapping for it."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_qk(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation.

    llama.cpp's converter reorders each head's rows from HF's rotate-half layout (first half of the
    rotary pairs, then the second half) to interleaved pairs (x0, y0, x1, y1 ...), the layout its
    rope kernel wants: reshape(heads, 2, d/2).swapaxes(1, 2). Viewing the rows as (heads, d/2, 2) and
    swapping back restores HF's order. Works for weights (rows x in) and biases (rows).
    """
    half = rows.shape[0] // n_heads // 2
    return rows.reshape(n_heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    # The per-frequency divisors llama.cpp stores as rope_freqs.weight for Llama-3.1-style scaling.
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    smooth = (orig / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, mid))


def llama3_rope_scaling(freqs: np.ndarray, theta: float, head_dim: int, orig: int | None) -> dict[str, Any] | None:
    """Recover HF's `rope_scaling` dict from llama.cpp's precomputed rope_freqs tensor.

    GGUF keeps only the resulting divisors, not the parameters; every Llama 3.x release uses
    low=1, high=4 and an 8192 original context, so we fit `factor` (the largest divisor) and
    check the whole curve, refusing rather than guessing when it does not match.
    """
    freqs = np.asarray(freqs, dtype=np.float64).reshape(-1)
    factor = float(freqs.max())
    if np.allclose(freqs, 1.0):
        return None
    for orig_ctx in dict.fromkeys((orig or 8192, 8192)):
        expect = _llama3_factors(theta, head_dim, factor, 1.0, 4.0, orig_ctx)
        if expect.shape == freqs.shape and np.allclose(expect, freqs, rtol=1e-4, atol=1e-6):
            return {
                "rope_type": "llama3",
                "factor": round(factor, 6),
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": orig_ctx,
            }
    raise UnsupportedModelError("rope_freqs.weight does not match Llama-3 rope scaling; cannot rebuild rope_scaling")


def _f32_decimal(x: float) -> float:
    # GGUF stores floats as f32 (1e-5 becomes 9.99999974e-06); keep the decimal the author wrote.
    return float(str(np.float32(x)))


def _open(path: Path) -> Any:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
        size = path.stat().st_size
        for t in reader.tensors:
            # A truncated file can still parse its header; make sure every tensor's bytes exist.
            if t.data_offset + t.n_bytes > size:
                raise ValueError(f"tensor {t.name} runs past the end of the file")
    except Exception as e:  # gguf-py raises ValueError, IndexError ... depending on where a file breaks
        raise ModelLoadError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); re-download it") from e
    return reader


def _metadata(reader: Any, path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as e:
            raise ModelLoadError(f"{path}: unreadable GGUF metadata key {key!r} ({e})") from e
    return meta


def gguf_hf_config(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """HF config.json for a GGUF file, from its metadata and tensor shapes (HF order)."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )

    def need(key: str) -> Any:
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    if "model.embed_tokens.weight" not in shapes:
        raise ModelLoadError(f"{path}: GGUF has no token_embd.weight tensor")
    vocab, hidden = shapes["model.embed_tokens.weight"]
    heads = int(need("attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv") or heads)
    head_dim = meta.get(f"{arch}.attention.key_length") or hidden // heads
    if arch != "qwen2" and meta.get(f"{arch}.rope.dimension_count"):
        head_dim = meta[f"{arch}.rope.dimension_count"]
    rope_theta = _f32_decimal(meta.get(f"{arch}.rope.freq_base", 10000.0))
    rope_scaling = None
    kind = meta.get(f"{arch}.rope.scaling.type")
    orig_ctx = meta.get(f"{arch}.rope.scaling.original_context_length")
    if kind in ("linear", "yarn"):
        rope_scaling = {"rope_type": kind, "factor": _f32_decimal(need("rope.scaling.factor"))}
        if kind == "yarn" and orig_ctx:
            rope_scaling["original_max_position_embeddings"] = int(orig_ctx)
    elif kind not in (None, "none"):
        raise UnsupportedModelError(f"{path}: rope scaling type {kind!r} is not supported")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    cfg: dict[str, Any] = {
        "architectures": [_HF_CLASS[arch]],
        # Mistral GGUFs say "llama"; the two share one HF layout, so the name is only cosmetic.
        "model_type": arch,
        "hidden_size": int(hidden),
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": int(head_dim),
        "hidden_act": "silu",
        "rms_norm_eps": _f32_decimal(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": int(need("context_length")),
        # The embedding's row count is what the weights can actually index.
        "vocab_size": int(vocab),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    if arch != "qwen2":
        cfg["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in shapes
        cfg["mlp_bias"] = False
    return cfg


def _dequantized(reader: Any, path: Path) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """All tensors as fp32 arrays in HF names and torch shape order, plus rope_freqs if present."""
    from gguf import quants

    unsupported = sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type.name not in _DEQUANTIZABLE})
    if unsupported:
        raise UnsupportedModelError(
            f"{path}: tensor type(s) {', '.join(unsupported)} not supported; "
            f"supported: {', '.join(sorted(_DEQUANTIZABLE))}"
        )
    unknown = [t.name for t in reader.tensors if t.name != "rope_freqs.weight" and hf_tensor_name(t.name) is None]
    if unknown:
        raise UnsupportedModelError(f"{path}: unexpected tensors {unknown[:5]} (not a plain llama/qwen2 decoder)")
    out: dict[str, np.ndarray] = {}
    rope_freqs = None
    for t in reader.tensors:
        try:
            arr = quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise UnsupportedModelError(f"{path}: tensor {t.name}: {e}") from e
        # GGUF lists dimensions fastest-first (ne0 = columns); torch wants them the other way round.
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)
        if t.name == "rope_freqs.weight":
            rope_freqs = arr
        else:
            out[hf_tensor_name(t.name)] = arr  # type: ignore[index]
    return out, rope_freqs


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Convert `gguf_path` into a Hugging Face folder at `out_dir` and return it.

    The folder is built in a temporary sibling and renamed into place, so `out_dir` either does not
    exist or is complete. If another process finished `out_dir` first, its copy is kept.
    """
    from safetensors.numpy import save_file

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = _open(gguf_path)
    meta = _metadata(reader, gguf_path)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:  # fail before the expensive part
        gguf_hf_config(meta, {}, gguf_path)
    tensors, rope_freqs = _dequantized(reader, gguf_path)
    cfg = gguf_hf_config(meta, {k: v.shape for k, v in tensors.items()}, gguf_path)
    if rope_freqs is not None:
        orig = meta.get(f"{arch}.rope.scaling.original_context_length")
        cfg["rope_scaling"] = llama3_rope_scaling(rope_freqs, cfg["rope_theta"], cfg["head_dim"], orig)
    if arch in ("llama", "mistral"):
        heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        for name in list(tensors):
            if ".self_attn.q_proj." in name:
                tensors[name] = np.ascontiguousarray(unpermute_qk(tensors[name], heads))
            elif ".self_attn.k_proj." in name:
                tensors[name] = np.ascontiguousarray(unpermute_qk(tensors[name], kv_heads))
    tokenizer, tok_config = build_gguf_tokenizer(meta, str(gguf_path))
    tok_config["model_max_length"] = cfg["max_position_embeddings"]

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out_dir.name}-", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        _write_json(tmp / "config.json", cfg)
        gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg.get(k) is not None}
        _write_json(tmp / "generation_config.json", gen)
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tok_config)
        _write_json(
            tmp / "mainspring_source.json",
            {"gguf": str(gguf_path), "converter_version": CONVERTER_VERSION, "name": meta.get("general.name")},
        )
        # mkdtemp (and safetensors' writer) create owner-only modes; the cache is plain shared data.
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
            # Flush before the rename publishes the folder: after a power cut it must not hold empty files.
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not (out_dir / "model.safetensors").is_file():
                raise
            # Lost a race with another converter: theirs is complete, drop ours.
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
