"""RL rollouts on engine replicas: the rollout engine's surface (`tokenizer`, `generate`, `update_weights`) over a
`ReplicaPool`, so `train/rollout.generate_groups` and the trainer's weight sync run on Ray unchanged.

A rollout batch is split by prompt: every sample of one prompt (a GRPO group) goes to one replica, so the group
shares that prompt's prefix cache, and distinct prompts spread by the router's load rule. Each replica runs its
share as one batch; a replica that dies, or whose engine stopped, hands its share to the others. A weight sync
puts the weights in Ray's object store once and every replica copies them in (`LLMEngine.update_weights`),
dropping its prefix cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mainspring.cluster.engine_replicas import ReplicaFailed, ReplicaPool
from mainspring.cluster.ray_cluster import ray_module
from mainspring.cluster.remote_tasks import task_exception
from mainspring.engine.errors import EngineStoppedError
from mainspring.engine.outputs import RequestOutput
from mainspring.engine.params import SamplingParams
from mainspring.engine.tokenizer import Tokenizer


class RolloutReplicas:
    def __init__(self, pool: ReplicaPool, tokenizer: Tokenizer) -> None:
        self.pool = pool
        self.tokenizer = tokenizer

    def generate(self, prompts: Sequence[Sequence[int]],
                 params: Sequence[SamplingParams] | SamplingParams | None = None) -> list[RequestOutput]:
        """Every prompt to completion (outputs in prompt order), over the replicas."""
        ray = ray_module()
        plist = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        outputs: list[RequestOutput | None] = [None] * len(prompts)
        todo = list(range(len(prompts)))
        failed: list[str] = []
        while todo:
            shares, routed = self._split(prompts, todo, failed)
            refs = {name: self.pool.handle(name).generate_batch.remote([list(prompts[i]) for i in idx],
                                                                       [plist[i] for i in idx])
                    for name, idx in shares.items()}
            todo = []
            try:
                for name, ref in refs.items():
                    try:
                        for i, out in zip(shares[name], ray.get(ref)):
                            outputs[i] = out
                    except (ray.exceptions.RayActorError, EngineStoppedError):  # Ray raises the latter as a subclass
                        self.pool.retire(name)
                        failed.append(name)
                        todo += shares[name]
                    except ray.exceptions.RayTaskError as exc:
                        raise task_exception(exc) from exc
            finally:
                for name in routed:
                    self.pool.router.done(name)
        return [o for o in outputs if o is not None]

    def _split(self, prompts: Sequence[Sequence[int]], idx: list[int],
               failed: list[str]) -> tuple[dict[str, list[int]], list[str]]:
        """Which replica runs which prompts, and the routes to mark done once the batch is back."""
        router = self.pool.router
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for i in idx:
            by_prompt.setdefault(tuple(prompts[i]), []).append(i)
        shares: dict[str, list[int]] = {}
        routed: list[str] = []
        try:
            for key, members in by_prompt.items():
                route = router.route(list(key), exclude=failed)  # counted in flight: the next prompt sees the load
                routed.append(route.replica)
                shares.setdefault(route.replica, []).extend(members)
        except LookupError as exc:
            for name in routed:
                router.done(name)
            raise ReplicaFailed(f"no engine replica left for the rollout batch (failed: {', '.join(failed)})") from exc
        return shares, routed

    def update_weights(self, weights: dict[str, Any]) -> tuple[int, int]:
        """Every replica takes `weights` (plain parameter names); (tensors written, bytes) of one replica."""
        ray = ray_module()
        ref = ray.put({k: v.detach().contiguous() for k, v in weights.items()})
        results = ray.get([self.pool.handle(n).update_weights.remote(ref) for n in self.pool.replicas])
        return results[0]
