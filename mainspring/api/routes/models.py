"""GET /v1/models and the one place that turns a request's `model` field into a served model.

Each engine is served under its own name and a `-fast` variant. The fast variant runs on its own engine
(int4 weights + speculative decoding, same tokenizer) when the server built one, else on the standard
engine; it is a separate price tier in the economics layer, and its requests are scheduled ahead of
standard ones (lower engine priority value runs first).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request

from mainspring.api import upstream
from mainspring.api.errors import APIError
from mainspring.engine.async_engine import AsyncLLMEngine
from mainspring.engine.loader import EMBEDDED_MODEL

router = APIRouter()

FAST_SUFFIX = "-fast"


@dataclass(frozen=True)
class ServedModel:
    id: str  # what responses report as `model`
    engine: AsyncLLMEngine
    tier: str  # "standard" | "fast": the price tier billing applies
    priority: int  # engine scheduling priority; lower runs first

    @property
    def max_model_len(self) -> int:
        """The usable context: the model's, or less when the KV pool cannot hold that many tokens."""
        eng = self.engine.engine
        return min(eng.max_model_len, eng.block_manager.num_blocks * eng.config.block_size)

    def context_len(self, body: object = None) -> int:
        """The usable context for one request: far past the model's own under a sliding window
        (the request's attention_window, else the engine's default policy), whose KV stays bounded."""
        eng = self.engine.engine
        window = getattr(body, "attention_window", None)
        if (window if window is not None else eng.kv_policy.window):
            return eng.config.max_window_model_len
        return self.max_model_len


def served_models(request: Request) -> list[ServedModel]:
    eng: AsyncLLMEngine = request.app.state.engine
    fast: AsyncLLMEngine = getattr(request.app.state, "fast_engine", None) or eng
    name = eng.engine.name
    return [ServedModel(name, eng, "standard", 0), ServedModel(name + FAST_SUFFIX, fast, "fast", -1)]


def resolve_model(request: Request, name: str, fast: bool = False) -> ServedModel:
    """Exact (case-sensitive) id, or the embedded model's alias "smollm2" (+ "-fast").

    `fast` (Anthropic's `speed: "fast"`) picks the fast variant of a standard model.
    """
    models = served_models(request)
    by_id = {m.id: m for m in models}
    base = models[0].engine.engine.name
    if base.startswith("SmolLM2"):  # the alias names the embedded model, not whatever else is loaded
        by_id[EMBEDDED_MODEL] = by_id[base]
        by_id[EMBEDDED_MODEL + FAST_SUFFIX] = by_id[base + FAST_SUFFIX]
    model = by_id.get(name)
    if model is None:
        raise APIError(404, f"The model '{name}' does not exist; this server serves "
                       f"{', '.join(m.id for m in models)} (see GET /v1/models)", param="model",
                       code="model_not_found")
    if fast and model.tier != "fast":
        model = by_id[model.id + FAST_SUFFIX]
    return model


def _card(m: ServedModel, created: int) -> dict:
    return {"id": m.id, "object": "model", "created": created, "owned_by": "mainspring", "tier": m.tier,
            "context_window": m.max_model_len}


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    created = int(request.app.state.started)
    return {"object": "list", "data": [_card(m, created) for m in served_models(request)]
            + upstream.model_cards(request, created)}


@router.get("/v1/models/{model_id}")
async def get_model(model_id: str, request: Request) -> dict:
    for card in upstream.model_cards(request, int(request.app.state.started)):
        if card["id"] == model_id:
            return card
    return _card(resolve_model(request, model_id), int(request.app.state.started))
