"""The API served by engine replicas on Ray (MAINSPRING_ENGINE_REPLICAS), through the official openai client over
real HTTP: chat works, a conversation's second turn is a cache hit on the replica that holds it, /health shows
the replicas, and bad input is still a 400."""

import httpx
import pytest

from mainspring.config import Settings
from tests.cluster.faults import stop_engine
from tests.servers import serve

pytestmark = pytest.mark.slow

SYSTEM = ("You are the support agent of a harbour town's ferry company. Answer briefly and politely. "
          "Timetables: the first ferry leaves at six, then every forty minutes until nine in the evening. ") * 4


@pytest.fixture(scope="module")
def server(ray_cluster, tmp_path_factory):
    from mainspring.api.app import create_app

    db = tmp_path_factory.mktemp("replicated-db") / "mainspring.db"
    settings = Settings(database_url=f"sqlite:///{db}", ray_address="local", engine_replicas=2, replica_threads=1)
    app = create_app(settings)
    with serve(app, None) as srv:
        yield srv


def test_chat_through_replicas_hits_the_cache_on_the_second_turn(server):
    import openai

    client = openai.OpenAI(base_url=server.openai_url, api_key="x", max_retries=0, timeout=120)
    system = "Desk of the first-turn test. " + SYSTEM  # a prefix no other test of the module sends first
    replicas = httpx.get(f"{server.url}/health", timeout=30).json()["replicas"]
    before = {name: r["requests"] for name, r in replicas.items()}
    cached = []
    for question in ("When is the first ferry?", "And the last one?"):
        r = client.chat.completions.create(
            model="smollm2", max_tokens=8, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
        assert r.choices[0].message.content and r.usage.completion_tokens >= 1
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0 and cached[1] >= 64  # the system prompt, on the replica that prefilled it

    health = httpx.get(f"{server.url}/health", timeout=30).json()
    replicas = health["replicas"]
    assert len(replicas) == 2 and health["routing"] == "prefix"
    # both turns on one replica (the module's other tests may have sent requests before: counted from here)
    assert sorted(r["requests"] - before.get(name, 0) for name, r in replicas.items()) == [0, 2]


def test_streaming_and_bad_input_through_replicas(server):
    import openai

    client = openai.OpenAI(base_url=server.openai_url, api_key="x", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(model="smollm2", max_tokens=6, temperature=0, stream=True,
                                                 messages=[{"role": "user", "content": "Say hello"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    r = httpx.post(f"{server.openai_url}/completions", json={"model": "smollm2", "prompt": [10**9], "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"]
    # checked by the engine itself, on the replica: its error crosses Ray as the same InvalidRequestError
    r = httpx.post(f"{server.openai_url}/chat/completions", timeout=60,
                   json={"model": "smollm2", "max_tokens": 2, "logit_bias": {"99999999": 5},
                         "messages": [{"role": "user", "content": "hi"}]})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "vocabulary" in message, r.text
    assert "pid=" not in message and "File " not in message, message  # the engine's words, not Ray's traceback


def _wait_for_replicas(pool, n: int) -> None:
    import time

    deadline = time.monotonic() + 120
    while len(pool.replicas) < n:  # a replacement starts in the background
        assert time.monotonic() < deadline, "the replica was not replaced"
        time.sleep(0.5)


def test_a_replica_that_dies_is_routed_around_and_replaced(server, ray_cluster):
    import openai

    engine = server.app.state.engine
    pool = engine.pool
    client = openai.OpenAI(base_url=server.openai_url, api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Is there a night ferry?"}]
    client.chat.completions.create(model="smollm2", max_tokens=4, temperature=0, messages=messages)
    ids = engine.tokenizer.encode_chat(messages, add_generation_prompt=True)
    home = pool.router.route(ids).replica  # where the conversation's prefix lives
    pool.router.done(home)
    ray_cluster.kill(pool.handle(home))
    r = client.chat.completions.create(model="smollm2", max_tokens=4, temperature=0, messages=messages)
    assert r.choices[0].message.content  # served by the other replica
    assert pool.stats[home].failovers == 1 and home not in pool.replicas
    _wait_for_replicas(pool, 2)
    health = httpx.get(f"{server.url}/health", timeout=30).json()
    assert len(health["replicas"]) == 2 and home not in health["replicas"]


def test_health_finds_a_replica_whose_engine_stopped_and_replaces_it(server, ray_cluster):
    import openai

    pool = server.app.state.engine.pool
    _wait_for_replicas(pool, 2)
    victim = pool.replicas[0]
    stop_engine(ray_cluster, pool.handle(victim))  # alive, but serving nothing more
    r = httpx.get(f"{server.url}/health", timeout=60)
    assert r.status_code == 200, r.text
    assert victim not in r.json()["replicas"] and victim in r.json()["replacing"]
    assert victim not in pool.replicas
    _wait_for_replicas(pool, 2)
    health = httpx.get(f"{server.url}/health", timeout=60).json()
    assert len(health["replicas"]) == 2 and victim not in health["replicas"] and health["replacing"] == []
    client = openai.OpenAI(base_url=server.openai_url, api_key="x", max_retries=0, timeout=120)
    r2 = client.chat.completions.create(model="smollm2", max_tokens=3, temperature=0,
                                        messages=[{"role": "user", "content": "Good morning"}])
    assert r2.choices[0].message.content
