"""Engine replicas as Ray actors behind one router: `ReplicaPool.stream` is `AsyncLLMEngine.stream` over N engines.

Each replica is an actor (`EngineReplica`) holding a whole engine: the model, its KV cache and prefix cache,
stepping on the actor's own compute thread. The pool picks a replica per request with the prefix router
(prefix_router.py), streams the request's outputs back as Ray streams them (an actor generator), and counts it
in flight there until it ends.

When a replica dies (its process killed, its node lost), the request moves to another:
- nothing streamed yet: it starts again there;
- part of the output streamed: it continues there from the prompt plus the tokens already sent, for the tokens
  left, and the outputs are re-based so the caller sees one request (cumulative token ids and text, usage over
  the original prompt). A request under a grammar (guided decoding) cannot be resumed mid-output, since the
  grammar's state is the dead replica's: it fails with `ReplicaFailed`.
A replica whose engine stopped (engine/async_engine.py: failed steps in a row, such as a lost GPU context) is
alive but serves nothing more: it answers EngineStoppedError before the request's first token, so the request
moves as from a dead one, and the replica is killed.
The dead replica leaves the router; `ReplicaPool.restart_dead` starts a fresh one in its place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from mainspring.cluster.prefix_router import PrefixRouter, Route, RouterConfig
from mainspring.cluster.ray_cluster import ray_module
from mainspring.cluster.remote_tasks import task_exception
from mainspring.config import Settings
from mainspring.engine.errors import EngineStoppedError
from mainspring.engine.outputs import RequestOutput, Usage
from mainspring.engine.params import SamplingParams

log = logging.getLogger(__name__)


INFO_TIMEOUT_S = 10.0  # a replica's facts come from its actor's event loop, not its compute thread: quick


class ReplicaFailed(RuntimeError):
    """Every replica that could serve the request failed, or it cannot be resumed elsewhere."""


class EngineReplica:
    """One engine in a Ray actor (the pool wraps this class with `ray.remote`; it never runs in the caller)."""

    def __init__(self, settings: dict[str, Any], threads: int) -> None:
        from mainspring.compute import compute_thread
        from mainspring.engine.async_engine import AsyncLLMEngine
        from mainspring.engine.engine import LLMEngine

        s = Settings(**settings)
        engine = compute_thread().call(lambda: LLMEngine.from_settings(s, threads=threads))
        self.engine = AsyncLLMEngine(engine)

    def info(self) -> dict[str, Any]:
        """What a caller needs to serve this engine's model without loading it (cluster/replicated_engine.py)."""
        eng = self.engine.engine
        return {"pid": os.getpid(), "model": eng.name, "stopped": self.engine.stopped is not None,
                "block_size": eng.config.block_size, "max_model_len": eng.max_model_len,
                "max_window_model_len": eng.config.max_window_model_len, "kv_window": eng.kv_policy.window,
                "vocab_size": eng.model_config.vocab_size, "stats": eng.stats()}

    async def generate_batch(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
        """Every prompt to completion, batched together by the engine (a rollout batch)."""
        import asyncio

        return list(await asyncio.gather(*(self.engine.generate(p, sp) for p, sp in zip(prompts, params))))

    async def update_weights(self, weights: dict[str, Any]) -> tuple[int, int]:
        """A trainer's weight sync (`LLMEngine.update_weights`), between two steps of this engine."""
        from mainspring.compute import compute_thread

        def update() -> tuple[int, int]:
            with self.engine._lock:
                return self.engine.engine.update_weights(weights)

        return await compute_thread().run(update)

    async def stream(self, prompt: list[int], params: SamplingParams, request_id: str, cache_salt: str | None,
                     priority: int = 0) -> AsyncIterator[RequestOutput]:
        async for out in self.engine.stream(prompt, params, request_id, priority, cache_salt=cache_salt):
            yield out


@dataclass
class ReplicaStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    failovers: int = 0


class ReplicaPool:
    """N engine replicas on Ray and the router between them. Drive it from one event loop."""

    def __init__(self, handles: dict[str, Any], router: PrefixRouter, actor_class: Any,
                 settings: dict[str, Any], threads: int) -> None:
        self._handles = handles
        self.router = router
        self._actor_class = actor_class
        self._settings, self._threads = settings, threads
        self.stats: dict[str, ReplicaStats] = {name: ReplicaStats() for name in handles}
        self._serial = len(handles)

    @classmethod
    def start(cls, settings: Settings, replicas: int, router: RouterConfig | None = None,
              threads: int | None = None) -> ReplicaPool:
        """Start `replicas` engine actors on the connected Ray cluster (cluster/ray_cluster.connect first) and
        wait until each has loaded its model."""
        if replicas < 1:
            raise ValueError("a replica pool needs at least one replica")
        ray = ray_module()
        threads = threads or settings.replica_threads
        actor_class = ray.remote(num_cpus=threads, max_restarts=0)(EngineReplica)
        config = settings.model_dump(mode="json")
        handles = {f"replica-{i}": actor_class.remote(config, threads) for i in range(replicas)}
        infos = ray.get([h.info.remote() for h in handles.values()])
        cfg = router or RouterConfig(policy=settings.routing_policy, block_size=infos[0]["block_size"])
        log.info("engine replicas up: %s", ", ".join(f"{n} (pid {i['pid']})" for n, i in zip(handles, infos)))
        return cls(handles, PrefixRouter(list(handles), cfg), actor_class, config, threads)

    @property
    def replicas(self) -> list[str]:
        return self.router.replicas

    def handle(self, replica: str) -> Any:
        return self._handles[replica]

    async def stream(self, prompt: Sequence[int], params: SamplingParams | None = None,
                     request_id: str | None = None, cache_salt: str | None = None,
                     priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Yields the request's outputs as its replica steps; the last is finished. Moves to another replica when
        its replica dies (see the module's docstring)."""
        ray = ray_module()
        params = params or SamplingParams()
        rid = request_id or uuid.uuid4().hex
        original = list(prompt)
        sent = RequestOutput(rid, original)  # what the caller has seen so far
        failed: list[str] = []
        while True:
            base, resume = sent, len(sent.token_ids)
            if resume and (params.guided_json is not None or params.guided_json_object or params.guided_regex
                           or params.guided_grammar):
                raise ReplicaFailed(f"request {rid}: its replica died after {resume} tokens and a guided "
                                    "request cannot resume on another")
            try:
                route = self.router.route(original + sent.token_ids, cache_salt, exclude=failed)
            except LookupError as exc:
                raise ReplicaFailed(f"request {rid}: no engine replica left to serve it "
                                    f"(failed: {', '.join(failed)})") from exc
            gen = self._handles[route.replica].stream.remote(
                original + sent.token_ids, _remaining(params, resume), f"{rid}.{len(failed)}", cache_salt, priority)
            finished = False
            try:
                async for ref in gen:
                    out = _rebased(await ref, base, original)
                    if not out.delta_token_ids and not out.finished and not out.delta_text:
                        continue
                    sent = out
                    if out.finished:
                        finished = True
                        self._count(route, out)
                    yield out
                    if finished:
                        return
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                died = isinstance(exc, ray.exceptions.RayActorError)
                if not died and not isinstance(exc, EngineStoppedError):
                    raise task_exception(exc) from exc  # the engine refused or failed it: the API's 400 or 500
                log.warning("engine replica %s %s serving %s after %d tokens: %s", route.replica,
                            "died" if died else "stopped", rid, len(sent.token_ids), exc)
                self.retire(route.replica)
                failed.append(route.replica)
                continue
            finally:
                self.router.done(route.replica)
                if not finished:  # the caller left (or the replica died): stop generating for nobody
                    try:
                        ray.cancel(gen)
                    except Exception:  # noqa: BLE001 - a dead actor's task needs no cancelling
                        pass
            raise ReplicaFailed(f"request {rid}: replica {route.replica} ended the stream before it finished")

    async def generate(self, prompt: Sequence[int], params: SamplingParams | None = None,
                       **kw: Any) -> RequestOutput:
        last = None
        async for out in self.stream(prompt, params, **kw):
            last = out
        assert last is not None
        return last

    def _count(self, route: Route, out: RequestOutput) -> None:
        st = self.stats[route.replica]
        st.requests += 1
        if out.usage is not None:
            st.prompt_tokens += out.usage.prompt_tokens
            st.cached_tokens += out.usage.cached_tokens

    def retire(self, replica: str) -> None:
        """A replica that died or whose engine stopped: out of the router, and its actor killed (a stopped
        engine's process still holds the model); `restart_dead` replaces it."""
        self.router.remove(replica)
        self.stats[replica].failovers += 1
        try:
            ray_module().kill(self._handles[replica])
        except Exception:  # noqa: BLE001 - it is dead already
            pass

    def dead(self) -> list[str]:
        """Replicas the router dropped after they failed, not yet restarted."""
        return [n for n in self._handles if n not in self.router.replicas]

    async def restart_dead(self) -> list[str]:
        """Start a fresh replica for each one the router dropped; the new replicas' names."""
        started: list[str] = []
        for name in self.dead():
            self._handles.pop(name)
            new = f"replica-{self._serial}"
            self._serial += 1
            handle = self._actor_class.remote(self._settings, self._threads)
            await handle.info.remote()  # its model is loaded
            self._handles[new] = handle
            self.stats[new] = ReplicaStats()
            self.router.add(new)
            started.append(new)
        return started

    def info(self, timeout_s: float = INFO_TIMEOUT_S) -> dict[str, dict[str, Any]]:
        """Each serving replica's facts (`EngineReplica.info`). One found dead or stopped is retired here, as a
        request would find it; one that does not answer within `timeout_s` is left out (and kept). Blocking:
        from an event loop, await `info_async`."""
        ray = ray_module()
        refs = self._ask_facts()
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        return self._read_facts(refs, ready, timeout_s)

    async def info_async(self, timeout_s: float = INFO_TIMEOUT_S) -> dict[str, dict[str, Any]]:
        """`info`, waiting without blocking the event loop (a hung replica must not stall the API)."""
        refs = self._ask_facts()
        futures = {asyncio.wrap_future(ref.future()): ref for ref in refs.values()}
        done, _ = await asyncio.wait(futures, timeout=timeout_s) if futures else (set(), set())
        return self._read_facts(refs, [futures[f] for f in done], timeout_s)

    def _ask_facts(self) -> dict[str, Any]:
        return {n: self._handles[n].info.remote() for n in self.router.replicas}

    def _read_facts(self, refs: dict[str, Any], ready: list[Any], timeout_s: float) -> dict[str, dict[str, Any]]:
        ray = ray_module()
        out: dict[str, dict[str, Any]] = {}
        for name, ref in refs.items():
            if ref not in ready:
                log.warning("engine replica %s did not answer within %.0f s", name, timeout_s)
                continue
            try:
                facts = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                log.warning("engine replica %s died: %s", name, exc)
                self.retire(name)
                continue
            if facts["stopped"]:
                log.warning("engine replica %s: its engine stopped", name)
                self.retire(name)
                continue
            out[name] = facts
        return out

    def close(self) -> None:
        ray = ray_module()
        for h in self._handles.values():
            ray.kill(h)
        self._handles.clear()


def _remaining(params: SamplingParams, done: int) -> SamplingParams:
    if not done:
        return params
    return dataclasses.replace(params, max_tokens=max(1, params.max_tokens - done),
                               min_tokens=max(0, params.min_tokens - done))


def _rebased(out: RequestOutput, before: RequestOutput, original: list[int]) -> RequestOutput:
    """A resumed request's output as the original request's: its prompt, every token since, usage over both.
    `before` is what the caller had seen when the request moved (its text ends where the new one's begins)."""
    resumed_at = len(before.token_ids)
    if not resumed_at:
        return out
    usage = out.usage
    if usage is not None:
        usage = Usage(prompt_tokens=len(original), cached_tokens=min(usage.cached_tokens, len(original)),
                      completion_tokens=resumed_at + usage.completion_tokens)
    return dataclasses.replace(
        out, request_id=before.request_id, prompt_token_ids=original, token_ids=before.token_ids + out.token_ids,
        text=before.text + out.text,
        logprobs=None if out.logprobs is None else (before.logprobs or []) + out.logprobs, usage=usage)
