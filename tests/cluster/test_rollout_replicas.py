"""A rollout batch through Ray: `generate_groups` over two engine replicas scores the same completions as the
in-process engine, a weight sync reaches every replica, a replica whose engine stopped hands its share on, and
a request the engine refuses raises the engine's own error."""

import asyncio

import pytest

from mainspring.cluster.engine_replicas import ReplicaPool
from mainspring.cluster.rollout_replicas import RolloutReplicas
from mainspring.config import Settings
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.params import SamplingParams
from mainspring.train.config import DomainSpec
from mainspring.train.domains.registry import load_domains
from mainspring.train.rollout import generate_groups
from tests.cluster.faults import stop_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rollouts(ray_cluster, embedded):
    pool = ReplicaPool.start(Settings(), replicas=2, threads=1)
    yield RolloutReplicas(pool, embedded.tokenizer)
    pool.close()


def test_a_rollout_batch_on_replicas_matches_the_local_engine(rollouts, embedded):
    domains = load_domains([DomainSpec(name="math", train_size=8)])
    samples = domains["math"].train[:4]
    local = LLMEngine(embedded, EngineConfig(kv_cache_mb=64))
    want, _ = generate_groups(local, samples, domains, 2, seed=0, step=0, greedy=True)
    got, stats = generate_groups(rollouts, samples, domains, 2, seed=0, step=0, greedy=True)
    assert [c.text for g in got for c in g.completions] == [c.text for g in want for c in g.completions]
    assert [c.score.total for g in got for c in g.completions] == [c.score.total for g in want for c in g.completions]
    assert stats.completion_tokens > 0


def test_a_weight_sync_reaches_every_replica(rollouts, embedded):
    local = LLMEngine(embedded, EngineConfig(kv_cache_mb=64))
    name, weight = next((n, p.detach().clone()) for n, p in local.model.named_parameters() if n == "norm.weight")
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(4)]  # four prompts: both replicas get some
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    before = [o.token_ids for o in rollouts.generate(prompts, params)]
    n, size = rollouts.update_weights({name: weight * 0})  # hidden states to zero: every logit 0, argmax token 0
    assert n == 1 and size == weight.numel() * 4
    assert all(o.token_ids == [0, 0, 0, 0] for o in rollouts.generate(prompts, params))
    rollouts.update_weights({name: weight})
    assert [o.token_ids for o in rollouts.generate(prompts, params)] == before


def test_a_replica_whose_engine_stopped_hands_its_share_to_the_other(rollouts, ray_cluster):
    from mainspring.engine.errors import InvalidRequestError

    prompts = [[100 + i, 200 + i, 300 + i] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    want = [o.token_ids for o in rollouts.generate(prompts, params)]
    broken = rollouts.pool.replicas[0]
    stop_engine(ray_cluster, rollouts.pool.handle(broken))
    assert [o.token_ids for o in rollouts.generate(prompts, params)] == want  # all on the healthy one now
    assert broken in rollouts.pool.dead() and rollouts.pool.stats[broken].failovers == 1

    bad = SamplingParams(temperature=0.0, max_tokens=4, logit_bias={10**8: 1.0})
    with pytest.raises(InvalidRequestError) as refused:
        rollouts.generate(prompts[:1], bad)
    assert "vocabulary" in str(refused.value) and "pid=" not in str(refused.value)
    started = asyncio.run(rollouts.pool.restart_dead())
    assert len(started) == 1 and len(rollouts.pool.replicas) == 2
