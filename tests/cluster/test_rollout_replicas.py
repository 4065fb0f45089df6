"""A rollout batch through Ray: `generate_groups` over two engine replicas scores the same completions as the
in-process engine, and a weight sync reaches every replica."""

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
