"""POST /v1/embeddings in OpenAI's shape, served by the embedded all-MiniLM-L6-v2.

Inputs may be a string, a list of strings, one token array or a list of token arrays. Token ids
are this model's word-piece ids (not OpenAI's cl100k), decoded to text and embedded like text.
An input longer than the model reads (256 word pieces, [CLS] and [SEP] included) is a 400, as
OpenAI answers an input over its limit; vLLM's `truncate_prompt_tokens` (-1: the model's limit,
or a smaller count) embeds the first word pieces instead, as sentence-transformers does.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from mainspring.compute import compute_thread
from mainspring.embeddings import MODEL_NAME, EmbeddingModel

router = APIRouter()

MODEL_ALIASES = frozenset({MODEL_NAME, "text-embedding-all-minilm", f"sentence-transformers/{MODEL_NAME}"})
MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


class EmbeddingRequest(BaseModel):
    # extra="ignore": OpenAI clients may send fields we have no use for (e.g. `user`)
    model_config = ConfigDict(extra="ignore")

    input: Any = None  # validated by hand below so every mistake is a 400 naming the problem
    model: str = MODEL_NAME
    encoding_format: str = "float"
    dimensions: Any = None
    user: str | None = None
    truncate_prompt_tokens: Any = None  # vLLM's: None = refuse long inputs, -1 = the model's limit, k = k


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem] = Field(default_factory=list)
    model: str
    usage: EmbeddingUsage


def _bad(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _token_array(ids: list, where: str, vocab_size: int) -> list[int]:
    if not ids:
        raise _bad(f"{where} is an empty token array")
    if not all(_is_int(t) and 0 <= t < vocab_size for t in ids):
        raise _bad(f"{where} must hold token ids in [0, {vocab_size})")
    return ids


def parse_input(raw: Any, embedder: EmbeddingModel | None = None) -> list[str] | list[list[int]]:
    """Normalize `input` to a list of strings, or a list of token arrays (decoded later)."""
    if raw is None:
        raise _bad("'input' is required")
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise _bad("'input' must be a string, a list of strings, or token arrays")
    if not raw:
        raise _bad("'input' is empty: give at least one string")
    if len(raw) > MAX_INPUTS:
        raise _bad(f"'input' has {len(raw)} items; at most {MAX_INPUTS} per request")
    if all(isinstance(x, str) for x in raw):
        for i, x in enumerate(raw):
            if not x:
                raise _bad(f"'input[{i}]' is an empty string")
        return raw
    vocab = embedder.vocab_size if embedder is not None else 1 << 31
    if all(_is_int(x) for x in raw):  # one token array
        return [_token_array(raw, "'input'", vocab)]
    if all(isinstance(x, list) for x in raw):
        return [_token_array(x, f"'input[{i}]'", vocab) for i, x in enumerate(raw)]
    raise _bad("'input' must be a string, a list of strings, a token array or a list of token arrays")


def parse_dimensions(raw: Any, full: int) -> int:
    if raw is None:
        return full
    if not _is_int(raw) or not 1 <= raw <= full:
        raise _bad(f"'dimensions' must be an integer between 1 and {full} for {MODEL_NAME}, got {raw!r}")
    return raw


def parse_truncation(raw: Any, limit: int) -> int | None:
    if raw is None:
        return None
    if not _is_int(raw) or not (raw == -1 or 1 <= raw <= limit):
        raise _bad(f"'truncate_prompt_tokens' must be -1 (the model's limit) or between 1 and {limit}, got {raw!r}")
    return limit if raw == -1 else raw


def check_lengths(lengths: list[int], limit: int) -> None:
    """A 400 for the first input the model would have to cut, naming its length and the limit."""
    for i, n in enumerate(lengths):
        if n > limit:
            where = "'input'" if len(lengths) == 1 else f"'input[{i}]'"
            raise _bad(f"{where} has {n} word pieces ([CLS] and [SEP] included), more than {MODEL_NAME} reads "
                       f"({limit}); shorten it, or send truncate_prompt_tokens: -1 to embed its first {limit}")


def encode_vectors(vectors: torch.Tensor, encoding_format: str) -> list[list[float] | str]:
    if encoding_format == "float":
        return vectors.tolist()
    # OpenAI's base64 is the raw little-endian float32 buffer of each vector
    return [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii") for v in vectors.numpy()]


async def get_embedder(request: Request) -> EmbeddingModel:
    """Load the model on first use (off the event loop) and cache it on the app."""
    state = request.app.state
    embedder = getattr(state, "embedder", None)
    if embedder is not None:
        return embedder
    lock = getattr(state, "embedder_lock", None)
    if lock is None:  # no await between the check and the set, so one lock per app
        lock = state.embedder_lock = asyncio.Lock()
    async with lock:  # concurrent first requests load the weights once
        if getattr(state, "embedder", None) is None:
            try:
                state.embedder = await compute_thread().run(EmbeddingModel.load)
            except FileNotFoundError as e:
                raise HTTPException(status_code=503, detail=f"the embedding model is unavailable: {e}") from e
    return state.embedder


@router.post("/v1/embeddings", response_model=EmbeddingResponse)
async def create_embeddings(body: EmbeddingRequest, request: Request) -> EmbeddingResponse:
    if body.model not in MODEL_ALIASES:
        raise HTTPException(status_code=404, detail=(
            f"the model {body.model!r} does not exist; embedding models: {', '.join(sorted(MODEL_ALIASES))}"))
    if body.encoding_format not in ("float", "base64"):
        raise _bad(f"'encoding_format' must be 'float' or 'base64', got {body.encoding_format!r}")
    parse_input(body.input)  # shape errors before paying for the model load
    embedder = await get_embedder(request)
    dims = parse_dimensions(body.dimensions, embedder.dim)
    items = parse_input(body.input, embedder)
    texts = [x if isinstance(x, str) else embedder.decode(x) for x in items]
    limit = embedder.max_seq_length
    cut = parse_truncation(body.truncate_prompt_tokens, limit)

    def work() -> tuple[torch.Tensor, int]:
        lengths = embedder.full_lengths(texts)
        if cut is None:
            check_lengths(lengths, limit)
        return embedder.embed(texts, max_length=cut), sum(min(n, cut or limit) for n in lengths)

    # on the compute thread, with the engines: torch keeps one thread pool per process (mainspring/compute.py)
    vectors, tokens = await compute_thread().run(work)
    if dims < embedder.dim:  # Matryoshka-style: keep the leading dimensions and renormalize, as OpenAI does
        vectors = F.normalize(vectors[:, :dims], p=2, dim=-1)
    data = [EmbeddingItem(index=i, embedding=e) for i, e in enumerate(encode_vectors(vectors, body.encoding_format))]
    return EmbeddingResponse(data=data, model=MODEL_NAME,
                             usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))
