"""Two real engine replicas (the embedded model) as Ray actors behind the router: prefix-aware routing keeps a
shared prompt's cache hits where round-robin loses them, and a replica killed mid-request hands it on."""

import asyncio
from collections import Counter

import pytest

from mainspring.cluster.engine_replicas import ReplicaPool
from mainspring.cluster.prefix_router import PrefixRouter, RouterConfig
from mainspring.config import Settings
from mainspring.engine.params import SamplingParams
from tests.cluster.faults import break_steps

pytestmark = pytest.mark.slow

SYSTEM = [100 + (7 * i) % 5000 for i in range(200)]  # a 200-token "system prompt": 12 full blocks of 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def pool(ray_cluster):
    p = ReplicaPool.start(Settings(), replicas=2, threads=1)
    yield p
    p.close()


def _run(coro):
    return asyncio.run(coro)


def test_prefix_routing_keeps_the_cache_hits_round_robin_loses(pool):
    async def turns(system, n):
        outs = []
        for i in range(n):
            outs.append(await pool.generate(system + [9000 + i, 9100 + i], GREEDY))
        return outs

    pool.router = PrefixRouter(pool.replicas, RouterConfig(policy="prefix", block_size=16))

    def requests() -> Counter[str]:
        return Counter({n: s.requests for n, s in pool.stats.items()})

    before = requests()  # the module's other test may have run first
    by_prefix = _run(turns(SYSTEM, 3))
    assert by_prefix[0].usage.cached_tokens < 192 <= min(o.usage.cached_tokens for o in by_prefix[1:])
    served = requests() - before  # the replicas that served these turns, and how many each
    assert list(served.values()) == [3], served  # every turn on the replica that cached the prompt

    other = [5 + (11 * i) % 4000 for i in range(200)]  # a prompt neither replica holds
    pool.router = PrefixRouter(pool.replicas, RouterConfig(policy="round_robin"))
    spread = _run(turns(other, 2))
    assert [o.usage.cached_tokens for o in spread] == [0, 0]  # the second turn went to the other replica


def test_a_replica_killed_mid_request_hands_it_to_another(pool, ray_cluster):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompt = SYSTEM[:50]

    async def reference():
        return await pool.generate(prompt, params)

    want = _run(reference())

    async def interrupted():
        seen, killed = [], None
        async for out in pool.stream(prompt, params):
            seen.append(out)
            if killed is None and len(out.token_ids) >= 8:
                killed = next(n for n in pool.replicas if pool.router.in_flight(n))
                ray_cluster.kill(pool.handle(killed))
        return seen, killed

    seen, killed = _run(interrupted())
    last = seen[-1]
    assert last.finished and len(last.token_ids) == 40
    assert last.usage.prompt_tokens == 50 and last.usage.completion_tokens == 40
    assert killed not in pool.replicas and pool.stats[killed].failovers == 1
    assert last.token_ids[:8] == want.token_ids[:8]  # what was streamed before the kill stands
    cumulative = [len(o.token_ids) for o in seen]
    assert cumulative == sorted(cumulative)  # one request to the caller: its token count only grows
    assert "".join(o.delta_text for o in seen) == last.text

    started = _run(pool.restart_dead())
    assert len(started) == 1 and len(pool.replicas) == 2


def test_a_replica_whose_engine_stopped_is_routed_around_and_replaced(pool, ray_cluster):
    from mainspring.engine.async_engine import STOP_AFTER_FAILED_STEPS
    from mainspring.engine.errors import EngineStepError

    broken, healthy = pool.replicas[:2]
    ray_cluster.get(pool.handle(broken).__ray_call__.remote(break_steps))
    pool.router = PrefixRouter([broken], RouterConfig(policy="round_robin"))
    for i in range(STOP_AFTER_FAILED_STEPS):  # each fails its request; the last stops that engine
        with pytest.raises(EngineStepError):
            _run(pool.generate([300 + i] * 20, GREEDY))
    assert broken in pool.replicas  # alive, and the router cannot tell yet

    pool.router = PrefixRouter([broken, healthy], RouterConfig(policy="round_robin"))  # broken comes first
    out = _run(pool.generate(SYSTEM[:30], GREEDY))
    assert out.finished and len(out.token_ids) == 4  # served by the healthy one
    assert pool.replicas == [healthy] and pool.dead() == [broken]
    assert pool.stats[broken].failovers == 1 and pool.stats[healthy].requests >= 1
    with pytest.raises(ray_cluster.exceptions.RayActorError):  # killed: a stopped engine frees its memory
        ray_cluster.get(pool.handle(broken).info.remote(), timeout=30)

    started = _run(pool.restart_dead())
    assert len(started) == 1 and sorted(pool.replicas) == sorted([healthy, *started])
    assert _run(pool.generate(SYSTEM[:30], GREEDY)).token_ids == out.token_ids


def test_a_replica_that_does_not_answer_is_left_out_of_the_facts_and_kept(pool, ray_cluster, tmp_path):
    from tests.cluster.faults import block_event_loop

    slow, release = pool.replicas[0], tmp_path / "release"
    blocker = pool.handle(slow).__ray_call__.remote(block_event_loop, str(release))  # runs before the info calls
    try:
        for infos in (pool.info(timeout_s=0.5), _run(pool.info_async(timeout_s=0.5))):
            assert slow not in infos and len(infos) == len(pool.replicas) - 1
        assert slow in pool.replicas and not pool.dead()  # slow is not dead: nothing to replace
    finally:
        release.touch()
    ray_cluster.get(blocker)
    assert slow in pool.info() and slow in _run(pool.info_async())
