"""The API's engine when the model runs on Ray replicas: `AsyncLLMEngine`'s surface over a `ReplicaPool`.

The API reads a few facts of its engine (the model's name, tokenizer, context length, KV pool size) and
streams requests through it. Here the facts come from the replicas (every replica serves the same model
with the same settings) and the tokenizer is loaded in this process from the same converted folder, without
the weights; every request goes through the pool's router. Aborting is leaving the stream: the pool cancels
the replica's generator, which aborts the request there. A replica that dies is replaced in the background.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mainspring.cluster.engine_replicas import ReplicaFailed, ReplicaPool
from mainspring.config import Settings
from mainspring.engine.outputs import RequestOutput
from mainspring.engine.params import SamplingParams
from mainspring.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class _Blocks:
    num_blocks: int


@dataclass(frozen=True)
class _Config:
    block_size: int
    max_window_model_len: int


@dataclass(frozen=True)
class _Policy:
    window: int


@dataclass(frozen=True)
class _ModelConfig:
    vocab_size: int


class ReplicatedModelView:
    """What the API reads of `AsyncLLMEngine.engine`, for the replicas' model."""

    linear_kernel = "on replicas"

    def __init__(self, pool: ReplicaPool, info: dict[str, Any], tokenizer: Tokenizer,
                 heal: Callable[[], None]) -> None:
        self._pool = pool
        self._heal = heal
        self.name: str = info["model"]
        self.tokenizer = tokenizer
        self.max_model_len: int = info["max_model_len"]
        self.block_manager = _Blocks(info["stats"]["kv_blocks"])
        self.config = _Config(info["block_size"], info["max_window_model_len"])
        self.kv_policy = _Policy(info["kv_window"] or 0)
        self.model_config = _ModelConfig(info["vocab_size"])

    async def stats(self) -> dict[str, Any]:
        """/health's engine figures: per replica, with the router's view of each. Asking finds replicas that
        died or stopped since the last request; their replacements start in the background."""
        infos = await self._pool.info_async()
        self._heal()
        return {"replicas": {name: {**i["stats"], "in_flight": self._pool.router.in_flight(name),
                                    "requests": self._pool.stats[name].requests,
                                    "cached_tokens": self._pool.stats[name].cached_tokens,
                                    "prompt_tokens": self._pool.stats[name].prompt_tokens}
                             for name, i in infos.items()},
                "not_answering": [n for n in self._pool.replicas if n not in infos],
                "replacing": self._pool.dead(),
                "routing": self._pool.router.config.policy, "kv_blocks": self.block_manager.num_blocks}

    def flush_kv_cache(self) -> int:
        return 0  # each replica's disk tier (if any) is its own


class ReplicatedEngine:
    """`AsyncLLMEngine` for the API, over engine replicas on Ray."""

    decode_rate = None  # plan admission by decode rate reads the in-process engine only

    def __init__(self, pool: ReplicaPool, tokenizer: Tokenizer) -> None:
        self.pool = pool
        infos = pool.info()
        if not infos:
            raise ReplicaFailed("no engine replica answered")
        self._healing: asyncio.Future | None = None
        self.engine = ReplicatedModelView(pool, next(iter(infos.values())), tokenizer, self._heal)
        self._lock = threading.Lock()

    @classmethod
    def start(cls, settings: Settings) -> ReplicatedEngine:
        """Join the configured Ray cluster and start `settings.engine_replicas` replicas (blocking: minutes for a
        large model)."""
        from mainspring.cluster import ray_cluster
        from mainspring.engine.loader import ensure_hf_dir, load_model_config, resolve_model_path

        ray_cluster.connect(settings)
        hf_dir = ensure_hf_dir(resolve_model_path(settings.model), settings.cache_dir)
        tokenizer = Tokenizer.from_dir(hf_dir, extra_eos_token_ids=load_model_config(hf_dir).eos_token_ids)
        return cls(ReplicaPool.start(settings, settings.engine_replicas), tokenizer)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    async def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                     request_id: str | None = None, priority: int = 0,
                     cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        try:
            async for out in self.pool.stream(ids, params, request_id, cache_salt, priority):
                yield out
        finally:
            self._heal()

    def _heal(self) -> None:
        """A replica died or stopped: start its replacement in the background, one restart at a time (called on
        the event loop, by a request's stream or /health)."""
        if self.pool.dead() and (self._healing is None or self._healing.done()):
            self._healing = asyncio.ensure_future(self.pool.restart_dead())

    async def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                       **kw: Any) -> RequestOutput:
        last = None
        async for out in self.stream(prompt, params, **kw):  # through stream: it heals the pool
            last = out
        assert last is not None
        return last

    def abort(self, request_id: str) -> None:
        """Nothing to do here: a request is aborted by leaving its stream."""

    def close(self) -> None:
        self.pool.close()
