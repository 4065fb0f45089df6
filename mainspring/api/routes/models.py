"""GET /v1/models and the one place that turns a request's `model` field into a served model.

Each engine is served under its own name and a `-fast` variant. The fast variant runs on its own engine
(int4 weights + speculative decoding, same tokenizer) when the server built one, else on the standard
engine; it is a separate price tier in the economics layer, and its requests are scheduled ahead of
standard ones (lower engine priority value runs first). Fine-tuned models (api/finetuned.py) are served
under their ft:... ids to the project that trained them, each on its own engine loaded on first use.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fastapi import APIRouter, Request

from mainspring.api import upstream
from mainspring.api.errors import APIError
from mainspring.api.finetuned import FineTunedModel, FineTunedModels
from mainspring.api.project_policy import policy_of, refuse_if_local_only
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


def base_models(request: Request) -> dict[str, ServedModel]:
    """The engine's models by id, with the embedded model's alias "smollm2" (+ "-fast")."""
    models = served_models(request)
    by_id = {m.id: m for m in models}
    base = models[0].engine.engine.name
    if base.startswith("SmolLM2"):  # the alias names the embedded model, not whatever else is loaded
        by_id[EMBEDDED_MODEL] = by_id[base]
        by_id[EMBEDDED_MODEL + FAST_SUFFIX] = by_id[base + FAST_SUFFIX]
    return by_id


def _registry(request: Request) -> FineTunedModels | None:
    return getattr(request.app.state, "finetuned", None)


async def find_finetuned(request: Request, name: str) -> FineTunedModel | None:
    """The fine-tuned model `name` if the caller may use it (its project's, or an operator's)."""
    registry = _registry(request)
    if registry is None:
        return None
    return await asyncio.to_thread(registry.find, request.state.principal, name)


async def resolve_model(request: Request, name: str, fast: bool = False) -> ServedModel:
    """Exact (case-sensitive) id: the engine's model, its alias, or a fine-tuned model of the caller's.

    `fast` (Anthropic's `speed: "fast"`) picks the fast variant of a standard model; a fine-tuned model
    has none and is served as it is.
    """
    by_id = base_models(request)
    model = by_id.get(name)
    if model is None:
        ft = await find_finetuned(request, name)
        registry = _registry(request)
        if ft is not None and registry is not None:  # found only through a registry
            return ServedModel(ft.id, await registry.engine(ft), "standard", 0)
        served = [m.id for m in served_models(request)]
        raise APIError(404, f"The model '{name}' does not exist; this server serves "
                       f"{', '.join(served)} and your fine-tuned models (see GET /v1/models)", param="model",
                       code="model_not_found")
    if fast and model.tier != "fast":
        model = by_id[model.id + FAST_SUFFIX]
    return model


def _card(m: ServedModel, created: int) -> dict:
    card = {"id": m.id, "object": "model", "created": created, "owned_by": "mainspring", "tier": m.tier,
            "context_window": m.max_model_len}
    engine = getattr(m.engine, "engine", None)
    choice = getattr(engine, "kernel_choice", None) if m.tier == "fast" else None
    if engine is not None and choice is not None:  # the weights the fast variant runs on this CPU (kernel_choice.py)
        card["weights"] = choice.name
        card["speculative"] = str(engine.config.speculative or "off")
    return card


def _ft_card(m: FineTunedModel) -> dict:
    return {"id": m.id, "object": "model", "created": m.created, "owned_by": "operator" if m.public else
            f"project-{m.project_id}" if m.project_id is not None else "anonymous", "tier": "standard",
            "context_window": m.context_window, "parent": m.base}


async def _ft_cards(request: Request) -> list[dict]:
    registry = _registry(request)
    if registry is None:
        return []
    return [_ft_card(m) for m in await asyncio.to_thread(registry.visible, request.state.principal)]


async def _upstream_cards(request: Request) -> list[dict]:
    """The upstream models' cards, none for a local-only project (api/project_policy.py): it may not use them."""
    cards = upstream.model_cards(request, int(request.app.state.started))
    return [] if cards and (await policy_of(request)).local_only else cards


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    created = int(request.app.state.started)
    return {"object": "list", "data": [_card(m, created) for m in served_models(request)]
            + await _ft_cards(request) + await _upstream_cards(request)}


@router.get("/v1/models/{model_id}")
async def get_model(model_id: str, request: Request) -> dict:
    for card in upstream.model_cards(request, int(request.app.state.started)):
        if card["id"] == model_id:
            await refuse_if_local_only(request, model_id)  # the same answer as a request to it would get
            return card
    if model_id not in base_models(request):
        ft = await find_finetuned(request, model_id)
        if ft is not None:
            return _ft_card(ft)
    return _card(await resolve_model(request, model_id), int(request.app.state.started))
