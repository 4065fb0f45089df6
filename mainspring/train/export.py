"""A trained policy as a model the engine serves: a Hugging Face folder (config, tokenizer, one
safetensors file in HF tensor names) that `engine.loader.load_model` reads like any other, plus the
LoRA adapter alone (adapter/) when the run trained one, which `apply_adapter` merges onto a base.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mainspring.engine.config import ModelConfig
from mainspring.engine.loader import LoadedModel
from mainspring.train.policy import ADAPTER, Policy

EXPORT_META = "mainspring_export.json"
ADAPTER_DIR = "adapter"


def hf_state_dict(cfg: ModelConfig, engine_weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Engine-named tensors (fused q/k/v and gate/up) -> Hugging Face names, un-fused."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    out = {}
    for name, t in engine_weights.items():
        t = t.detach().contiguous()
        if name == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                out[name] = t
            continue
        base = "model." + name
        if ".qkv_proj." in name:
            kind = name.rsplit(".", 1)[1]  # weight | bias
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), t.split([q, kv, kv], dim=0)):
                out[base.replace("qkv_proj." + kind, f"{part}.{kind}")] = piece.contiguous()
        elif ".gate_up_proj." in name:
            gate, up = t.chunk(2, dim=0)
            out[base.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
            out[base.replace("gate_up_proj", "up_proj")] = up.contiguous()
        else:
            out[base] = t
    return out


def export_model(policy: Policy, base: LoadedModel, out_dir: Path, meta: dict) -> Path:
    """Write the policy (LoRA merged) as an HF folder beside the base model's config and tokenizer."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in Path(base.path).iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json", ".lock",
                                                "mainspring_source.json")):
            shutil.copy2(f, tmp / f.name)
    _write_config(tmp / "config.json", policy.config)
    weights = dict(base.state_dict)  # untouched tensors (norms, embeddings under LoRA) come from the base
    weights.update(hf_state_dict(policy.config, policy.merged_weights()))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
    if policy.lora is not None:
        (tmp / ADAPTER_DIR).mkdir()
        save_file({k: v.contiguous() for k, v in policy.trainable_state().items()},
                  str(tmp / ADAPTER_DIR / "adapter_model.safetensors"))
        spec = {"r": policy.lora.r, "alpha": policy.lora.alpha, "targets": policy.lora.targets,
                "base": meta.get("base"), "format": "mainspring-lora/1 (engine module names)"}
        (tmp / ADAPTER_DIR / "adapter_config.json").write_text(json.dumps(spec, indent=2))
    (tmp / EXPORT_META).write_text(json.dumps(meta, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def _write_config(path: Path, cfg: ModelConfig) -> None:
    """The base's config.json with the architecture the weights really have (a base given in memory,
    as tests build one, may differ from the folder it names)."""
    data = json.loads(path.read_text()) if path.exists() else {"architectures": ["LlamaForCausalLM"]}
    data.update(model_type=cfg.architecture, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                max_position_embeddings=cfg.max_position_embeddings, vocab_size=cfg.vocab_size,
                tie_word_embeddings=cfg.tie_word_embeddings, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta)
    path.write_text(json.dumps(data, indent=2))


def apply_adapter(loaded: LoadedModel, adapter_dir: Path) -> LoadedModel:
    """The base model with an exported LoRA adapter merged into its weights (W + B A alpha / r)."""
    adapter_dir = Path(adapter_dir)
    spec = json.loads((adapter_dir / "adapter_config.json").read_text())
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    scale = float(spec["alpha"]) / int(spec["r"])
    engine_names = {}
    for key in tensors:
        if f".lora_A.{ADAPTER}.weight" in key:
            module = key.split(".lora_A.")[0]
            a, b = tensors[key], tensors[f"{module}.lora_B.{ADAPTER}.weight"]
            engine_names[module + ".weight"] = (b.float() @ a.float()) * scale
    cfg = loaded.config
    deltas = hf_state_dict(cfg, engine_names)
    sd = dict(loaded.state_dict)
    for name, d in deltas.items():
        if name not in sd:
            raise ValueError(f"adapter tensor {name} has no counterpart in the base model")
        if sd[name].shape != d.shape:
            raise ValueError(f"adapter tensor {name}: shape {tuple(d.shape)} != base {tuple(sd[name].shape)}")
        sd[name] = sd[name] + d
    return dataclasses.replace(loaded, state_dict=sd)
