"""User domains: a JSONL data file plus a scorer named by module path or served over HTTP
(a real server on 127.0.0.1), and the DomainErrors a bad file or scorer gives."""

import json
import math

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import DomainError, score_safely
from mainspring.train.domains.registry import load_domain
from mainspring.train.domains.user import in_train, load_samples
from tests.servers import serve

LINES = [
    {"id": "q1", "prompt": "Capital of France?", "answer": "Paris", "split": "train"},
    {"id": "q2", "prompt": "Capital of Spain?", "answer": "Madrid", "split": "eval"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of Peru?"}],
     "answer": "Lima", "split": "train"},
    {"id": 7, "prompt": "Capital of Chile?", "answer": "Santiago", "split": "eval", "tags": ["geo"]},
]


def write(tmp_path, lines, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def user(tmp_path, lines=LINES, scorer="tests.train.scorers:exact", **knobs):
    return load_domain(DomainSpec(name="capitals", data=str(write(tmp_path, lines)), scorer=scorer, **knobs))


def test_jsonl_with_a_module_scorer(tmp_path):
    d = user(tmp_path, max_tokens=12, eval_size=1)
    assert [s.id for s in d.train][0] == "q1" and len(d.train) == 2 and [s.id for s in d.eval] == ["q2"]
    q1, peru = d.train
    assert q1.messages == ({"role": "user", "content": "Capital of France?"},) and q1.domain == "capitals"
    assert q1.reference == {"answer": "Paris"}  # id, prompt and split are the sample's, not the reference's
    assert peru.messages[0] == {"role": "system", "content": "Be brief."} and peru.id.startswith("h")
    assert d.settings.max_tokens == 12 and d.settings.temperature == 1.0
    assert d.scorer.score(q1, " Paris ").total == 1.0 and d.scorer.score(q1, "Lyon").total == 0.0
    assert load_domain(DomainSpec(name="c", data=str(tmp_path / "data.jsonl"), scorer="tests.train.scorers:exact"),
                       ).eval[-1].reference == {"answer": "Santiago", "tags": ["geo"]}


@pytest.mark.parametrize("function, total, parts", [
    ("as_score", 1.0, {"exact": 1.0, "short": 1.0}), ("as_dict", 0.5, {"half": 0.5}), ("constant", 0.25, {}),
])
def test_scorer_return_forms(tmp_path, function, total, parts):
    d = user(tmp_path, scorer=f"tests.train.scorers:{function}")
    score = score_safely(d.scorer, d.train[0], "Paris")
    assert score.error is None and score.total == total and score.parts == parts


@pytest.mark.parametrize("function, error", [
    ("raises", "ValueError: no answer field"), ("nan", "non-finite total nan"),
    ("not_a_score", "returned str; expected a float"),
])
def test_failing_user_scorers_are_zeros_with_a_reason(tmp_path, function, error):
    d = user(tmp_path, scorer=f"tests.train.scorers:{function}")
    score = score_safely(d.scorer, d.train[0], "Paris")
    assert score.total == 0.0 and error in score.error


def test_default_split_is_a_stable_hash_of_the_id(tmp_path):
    lines = [{"id": f"s{i}", "prompt": f"question {i}"} for i in range(300)]
    d = user(tmp_path, lines)
    assert 0.7 < len(d.train) / 300 < 0.9
    assert [s.id for s in d.eval] == [f"s{i}" for i in range(300) if not in_train(f"s{i}")]
    shuffled = user(tmp_path, lines[::-1])
    assert {s.id for s in shuffled.eval} == {s.id for s in d.eval}


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "a", "split": "train"}', "", "{not json"], r"line 3: not valid JSON"),
    (['["a list"]'], "line 1: expected a JSON object, got list"),
    (['{"answer": 1}'], 'line 1: give either "messages" or "prompt"'),
    (['{"prompt": "a", "messages": [{"role": "user", "content": "a"}]}'], "exactly one"),
    (['{"messages": [{"role": "robot", "content": "a"}]}'], "line 1: messages.0.role"),
    (['{"messages": [{"role": "system", "content": "a"}]}'], "has no user turn"),
    (['{"prompt": "a", "split": "test"}'], "line 1: split"),
    (['{"id": "x", "prompt": "a"}', '{"id": "x", "prompt": "b"}'], "line 2: duplicate id 'x', first on line 1"),
    (['{"prompt": "same"}', '{"prompt": "same"}'], "the same prompt as that line: give the lines ids"),
    (["", "   "], "has no samples"),
    (['{"prompt": "a", "split": "train"}'], 'no eval samples; mark some lines "split": "eval"'),
])
def test_bad_data_files(tmp_path, lines, message):
    with pytest.raises(DomainError, match=message):
        user(tmp_path, lines)


def test_missing_file_and_bad_scorers(tmp_path):
    with pytest.raises(DomainError, match=r"data file .*nowhere.jsonl not found"):
        load_domain(DomainSpec(name="u", data=str(tmp_path / "nowhere.jsonl"), scorer="tests.train.scorers:exact"))
    with pytest.raises(DomainError, match="a data file needs a scorer"):
        load_domain(DomainSpec(name="u", data=str(write(tmp_path, LINES))))
    for scorer, message in [
        ("tests.train.no_such_module:f", "no module named 'tests.train.no_such_module'"),
        ("tests.train.scorers:missing", "module tests.train.scorers has no 'missing'"),
        ("tests.train.scorers:NOT_CALLABLE", r"NOT_CALLABLE is not callable \(it is int\)"),
        ("just a name", 'expected "package.module:function" or an http'),
        ("http://", "has no host|is not valid"),
    ]:
        with pytest.raises(DomainError, match=message):
            user(tmp_path, scorer=scorer)


def test_samples_without_a_scorer_can_be_read(tmp_path):
    train, eval_ = load_samples(write(tmp_path, LINES), "capitals")
    assert [s.id for s in train + eval_] == ["q1", train[1].id, "q2", "7"]


# ---- an HTTP scorer on a real server ------------------------------------------------------------
def scorer_app() -> FastAPI:
    app = FastAPI()
    app.state.seen = []

    @app.post("/score")
    async def score(request: Request):
        body = await request.json()
        app.state.seen.append(body)
        hit = body["completion"].strip() == body["sample"]["reference"]["answer"]
        return {"total": float(hit), "parts": {"exact": float(hit)}}

    @app.post("/broken")
    async def broken():
        return JSONResponse({"detail": "scorer crashed"}, status_code=500)

    @app.post("/malformed")
    async def malformed():
        return {"score": 1}

    @app.post("/slow")
    async def slow():
        import asyncio

        await asyncio.sleep(2)
        return {"total": 1.0}

    return app


def test_http_scorer(tmp_path):
    app = scorer_app()
    with serve(app, None) as server:
        d = user(tmp_path, scorer=f"{server.url}/score")
        q1 = d.train[0]
        good, bad = score_safely(d.scorer, q1, "Paris"), score_safely(d.scorer, q1, "Rome")
        assert (good.total, good.parts, bad.total) == (1.0, {"exact": 1.0}, 0.0)
        sent = app.state.seen[0]
        assert sent["completion"] == "Paris"
        assert sent["sample"] == {"id": "q1", "domain": "capitals", "reference": {"answer": "Paris"},
                                  "messages": [{"role": "user", "content": "Capital of France?"}]}
        broken = score_safely(user(tmp_path, scorer=f"{server.url}/broken").scorer, q1, "Paris")
        assert broken.total == 0.0 and "answered HTTP 500" in broken.error and "scorer crashed" in broken.error
        malformed = score_safely(user(tmp_path, scorer=f"{server.url}/malformed").scorer, q1, "Paris")
        assert "malformed score (total: Field required)" in malformed.error
        slow = load_domain(DomainSpec(name="c", data=str(tmp_path / "data.jsonl"), scorer=f"{server.url}/slow"))
        slow.scorer.client.timeout = 0.3  # the domain's score_timeout_s, shortened for the test
        timed_out = score_safely(slow.scorer, q1, "Paris")
        assert timed_out.total == 0.0 and "Timeout" in timed_out.error
    assert math.isfinite(good.total)
