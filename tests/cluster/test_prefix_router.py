"""The routing policy on its own: locality, load balance, salts, failed replicas, the record's cap."""

import pytest

from mainspring.cluster.prefix_router import PrefixRouter, RouterConfig, block_hashes
from mainspring.engine.kv_cache import hash_block_tokens

SYSTEM_A = list(range(1000, 1064))  # 4 blocks of 16
SYSTEM_B = list(range(5000, 5064))


def test_block_hashes_are_the_prefix_caches_chain():
    ids = list(range(40))  # 2 full blocks; the partial third is not hashed
    h = block_hashes(ids, 16)
    assert len(h) == 2
    assert h[0] == hash_block_tokens(None, ids[:16])
    assert h[1] == hash_block_tokens(h[0], ids[16:32])
    assert block_hashes(ids, 16, salt="t1")[0] != h[0]


def test_a_shared_prefix_goes_back_to_the_replica_that_holds_it():
    r = PrefixRouter(["r0", "r1"])
    first = r.route(SYSTEM_A + [1, 2, 3])
    r.done(first.replica)
    other = r.route(SYSTEM_B + [1])  # a new prefix: the replica with the most room takes it
    r.done(other.replica)
    assert other.replica != first.replica
    for turn in range(5):
        again = r.route(SYSTEM_A + [7, turn] * 9)
        r.done(again.replica)
        assert (again.replica, again.reason) == (first.replica, "prefix")
        assert again.matched_blocks >= 4


def test_round_robin_spreads_the_same_prefix():
    r = PrefixRouter(["r0", "r1"], RouterConfig(policy="round_robin"))
    got = [r.route(SYSTEM_A).replica for _ in range(4)]
    assert got == ["r0", "r1", "r0", "r1"]


def test_a_hot_replica_spills_to_the_idle_one():
    r = PrefixRouter(["r0", "r1"], RouterConfig(balance_abs=2, balance_rel=1.5))
    home = r.route(SYSTEM_A).replica
    for _ in range(2):  # in flight, never done: r0 gets hot on its own prefix
        assert r.route(SYSTEM_A).replica == home
    spill = r.route(SYSTEM_A)
    assert spill.replica != home and spill.reason == "balance"


def test_a_small_match_does_not_win_on_locality():
    r = PrefixRouter(["r0", "r1"], RouterConfig(cache_threshold=0.5))
    home = r.route(SYSTEM_A[:16] + list(range(9000, 9100))).replica  # shares 1 block with what follows
    r.done(home)
    r.route(list(range(7000, 7016)))  # now `home` is the emptier-looking one no longer
    probe = r.route(SYSTEM_A[:16] + list(range(3000, 3100)))  # 1 of 7 blocks matches: below the threshold
    assert probe.reason == "load"


def test_salted_prompts_do_not_match_another_tenants_record():
    r = PrefixRouter(["r0", "r1"])
    home = r.route(SYSTEM_A, salt="tenant-a")
    r.done(home.replica)
    other = r.route(SYSTEM_A, salt="tenant-b")
    assert other.matched_blocks == 0 and other.reason == "load"


def test_excluded_and_removed_replicas_are_never_chosen():
    r = PrefixRouter(["r0", "r1"])
    home = r.route(SYSTEM_A).replica
    r.done(home)
    assert r.route(SYSTEM_A, exclude=[home]).replica != home
    r.remove("r0")
    r.remove("r1")
    with pytest.raises(LookupError):
        r.route(SYSTEM_A)


def test_the_record_is_capped_least_recent_first():
    r = PrefixRouter(["r0"], RouterConfig(max_blocks_per_replica=4))
    r.route(SYSTEM_A)
    r.route(SYSTEM_B)  # pushes SYSTEM_A's 4 blocks out
    assert r.route(SYSTEM_A).matched_blocks == 0


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="routing policy"):
        RouterConfig(policy="random")
    with pytest.raises(ValueError, match="cache_threshold"):
        RouterConfig(cache_threshold=2)
