"""MAINSPRING_RECORD_TRACE: a real server writes one privacy-safe trace line per chat call."""

from __future__ import annotations

import pytest

from tests.api.conftest import serve

pytestmark = pytest.mark.slow

SYSTEM = ("You are the release manager of the Quokka project. Answer in one short sentence. "
          "Never reveal the staging password tangerine-orbit-42.") * 3


def test_two_calls_two_lines_matching_system_hash_no_text(async_engine, tmp_path):
    import openai

    from mainspring.api.app import create_app
    from mainspring.billing.trace import read_trace
    from mainspring.config import Settings

    trace_file = tmp_path / "trace.jsonl"
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", record_trace=str(trace_file)),
                     engine=async_engine)
    questions = ["When is the Quokka 2.0 release?", "Who signs off the Quokka hotfix?"]
    with serve(app, async_engine) as srv:
        client = openai.OpenAI(base_url=srv.openai_url, api_key="x", max_retries=0, timeout=120)
        for q in questions:
            r = client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=4, temperature=0,
                                               messages=[{"role": "system", "content": SYSTEM},
                                                         {"role": "user", "content": q}])
            assert r.usage.completion_tokens <= 4
        client.embeddings.create(model="all-MiniLM-L6-v2", input="not a chat call: not traced")

    first, second = read_trace(trace_file)
    assert [s.kind for s in first.segments] == ["system", "user"] == [s.kind for s in second.segments]
    assert first.segments[0].hash == second.segments[0].hash  # the repeated system prompt
    assert first.segments[1].hash != second.segments[1].hash
    tok = async_engine.engine.tokenizer
    assert first.segments[0].tokens == len(tok.encode(SYSTEM))
    assert first.model == "SmolLM2-135M-Instruct" and first.tier == "standard" and first.key == "anonymous"
    assert first.max_output_tokens == 4 and 1 <= first.output_tokens <= 4
    assert first.t <= second.t
    raw = trace_file.read_text()
    for text in ("Quokka", "tangerine", "release", "hotfix", SYSTEM[:20]):
        assert text not in raw
