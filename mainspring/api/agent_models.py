"""The models an agent may use in this server, handed to the agent runtime as its model resolver.

The runtime only sees `(model name, the run's project) -> ChatModel` (agents/loop.py `ModelResolver`); what
stands behind a name is the server's business: the embedded engine, an upstream, or a fine-tuned model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator

from mainspring.agents.journal import JournalError
from mainspring.api.finetuned import FineTunedModel, FineTunedModels
from mainspring.api.project_policy import local_only_error, read_policy
from mainspring.api.upstream import Upstreams
from mainspring.engine.loader import EMBEDDED_MODEL
from mainspring.models import ChatModel, Completion, CompletionChunk, LocalModel, OpenAICompatibleModel

if TYPE_CHECKING:
    from mainspring.engine.async_engine import AsyncLLMEngine

DEFAULT_MODEL = "default"  # what an agent spec may say for "whatever this server runs"


@dataclass
class AppModels:
    """Model names an agent may use: the local engine's (its own name, the configured `Settings.model`, "default",
    and the embedded model's name that agent specs default to), the upstreams, and the fine-tuned models (ft:...)
    its project may see, each made when a run first calls it."""

    engine: AsyncLLMEngine | None
    upstreams: Upstreams
    finetuned: FineTunedModels | None
    configured_model: str  # Settings.model
    # the server's database, for the project's data policy; None: the fine-tuned registry's (the same database)
    policy_db: Any = None
    _cache: dict[str, ChatModel] = field(default_factory=dict, repr=False)

    def local_names(self) -> set[str]:
        if self.engine is None:
            return set()
        return {DEFAULT_MODEL, EMBEDDED_MODEL, self.configured_model, self.engine.engine.name}

    def _on_engine(self, name: str) -> bool:
        return self.engine is not None and self.upstreams.get(name) is None and name in self.local_names()

    def engine_rate(self, name: str) -> float | None:
        """The embedded engine's measured tokens/s when `name` runs on it (engine/decode_rate.py), else None: an
        upstream or fine-tuned model, or no step measured yet. The plan scheduler's admission reads it."""
        meter = getattr(self.engine, "decode_rate", None)
        return meter.tokens_per_s() if meter is not None and self._on_engine(name) else None

    def engine_key(self, name: str) -> str:
        """One name for every alias of the embedded engine, so admission counts its runs together."""
        return self.engine.engine.name if self.engine is not None and self._on_engine(name) else name

    def _refuse_if_local_only(self, name: str, project_id: int | None) -> None:
        """A local-only project's data never goes to an upstream (store/data_policy.py). Checked on every
        resolution, not only when a run is created: a policy set while a run waits or runs stops its next step."""
        db = self.policy_db if self.policy_db is not None else getattr(self.finetuned, "db", None)
        if project_id is None or db is None:
            return
        if read_policy(db, project_id).local_only:
            raise JournalError(local_only_error(name).message, status=403)

    def __call__(self, name: str, project_id: int | None = None) -> ChatModel:
        if self.upstreams.get(name) is not None:  # one primary-key read, only for an upstream model
            self._refuse_if_local_only(name, project_id)
        if name in self._cache:
            return self._cache[name]
        route = self.upstreams.get(name)
        model: ChatModel
        if route is not None:
            model = OpenAICompatibleModel(route.upstream.url("/v1"), route.upstream.api_key or None,
                                          model=route.model.remote, timeout=route.upstream.timeout_s)
        elif self.engine is not None and name in self.local_names():
            model = LocalModel(self.engine)
        elif self.finetuned is not None and (ft := self.finetuned.find_for_project(project_id, name)) is not None:
            return FineTunedChat(self.finetuned, ft)  # not cached: visibility is per project
        else:
            raise JournalError(f"unknown model {name!r} for an agent", status=400)
        self._cache[name] = model
        return model


class FineTunedChat(ChatModel):
    """A fine-tuned model as an agent's ChatModel: its engine is loaded (or reused) by the registry on first call."""

    def __init__(self, registry: FineTunedModels, ft: FineTunedModel) -> None:
        self.registry, self.ft, self.model = registry, ft, ft.id

    async def _model(self) -> LocalModel:
        return LocalModel(await self.registry.engine(self.ft), model=self.ft.id)

    async def chat(self, messages: list, **kwargs: Any) -> Completion:
        return await (await self._model()).chat(messages, **kwargs)

    async def stream(self, messages: list, **kwargs: Any) -> AsyncIterator[CompletionChunk]:
        async for chunk in (await self._model()).stream(messages, **kwargs):
            yield chunk
