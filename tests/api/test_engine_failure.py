"""A step that raises, on the embedded model: the requests in the engine fail with it, the engine serves the next
ones as before (same greedy tokens, every KV block back), and failing steps in a row stop it, which /health and
every later request report as a 503. The failure is injected into the model runner: a request with seed 666
breaks any step it is in, as a request parameter the engine failed to validate once did (a window past int64)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from mainspring.engine.async_engine import STOP_AFTER_FAILED_STEPS, AsyncLLMEngine
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.params import SamplingParams
from tests.servers import serve

POISON = 666
PROMPT = "The quick brown fox jumps over the lazy dog because"


@pytest.fixture
def engine(embedded, monkeypatch):
    llm = LLMEngine(embedded, EngineConfig(kv_cache_mb=64))
    execute = llm.runner.execute

    def poisoned(scheduled, *args, **kwargs):
        if any(s.seq.params.seed == POISON for s in scheduled):
            raise RuntimeError("a step broken by a request")
        return execute(scheduled, *args, **kwargs)

    monkeypatch.setattr(llm.runner, "execute", poisoned)
    eng = AsyncLLMEngine(llm)
    yield eng
    eng.close()


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, **kw)


def test_a_failed_step_fails_the_requests_in_the_engine_and_the_next_ones_are_served(engine):
    llm = engine.engine

    async def main():
        before = await engine.generate(PROMPT, greedy(8))
        bystander = engine.stream("Count: 1, 2, 3,", greedy(256, ignore_eos=True))
        await bystander.__anext__()  # running in the engine when the poisoned request joins it
        poisoned = asyncio.ensure_future(engine.generate(PROMPT, SamplingParams(max_tokens=4, seed=POISON)))
        with pytest.raises(RuntimeError, match="the engine failed while serving this request") as lost:
            async for _ in bystander:
                pass
        with pytest.raises(RuntimeError, match="the engine failed while serving this request") as failed:
            await poisoned
        after = await engine.generate(PROMPT, greedy(8))
        return before, after, lost.value, failed.value

    before, after, lost, failed = asyncio.run(main())
    assert str(failed.__cause__) == str(lost.__cause__) == "a step broken by a request"
    assert after.token_ids == before.token_ids and engine.stopped is None
    assert llm.num_requests == 0 and llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_failing_steps_in_a_row_stop_the_engine_and_health_and_requests_say_503(engine, tmp_path):
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'db.sqlite'}"), engine=engine)
    with serve(app, engine) as srv:
        client = openai.OpenAI(base_url=srv.openai_url, api_key="x", max_retries=0, timeout=120)

        def ask(**extra):
            return client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                                  max_tokens=4, temperature=0, **extra)

        assert ask().choices[0].message.content
        for _ in range(STOP_AFTER_FAILED_STEPS):
            assert httpx.get(f"{srv.url}/health").status_code == 200  # still serving after each failure
            with pytest.raises(openai.InternalServerError) as e:
                ask(seed=POISON)
            assert e.value.status_code == 500
            assert e.value.body["message"] == "the engine could not serve this request: the engine failed while " \
                                              "serving this request"
        health = httpx.get(f"{srv.url}/health")
        assert health.status_code == 503
        assert health.json()["error"]["code"] == "engine_stopped" and health.json()["models"] == [engine.engine.name]
        with pytest.raises(openai.InternalServerError) as e:
            ask()  # a good request, refused at once: nothing would ever step it
        assert e.value.status_code == 503 and e.value.body["code"] == "engine_stopped"
        assert "restart the server" in e.value.body["message"]
