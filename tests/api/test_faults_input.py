"""Bad input never costs the server its event loop or a 500: bodies over the cap are a 413 (by Content-Length
and while a chunked body streams in), long prompts tokenize off the loop, and text that is not valid Unicode
(lone surrogates) is a 400 on every route."""

from __future__ import annotations

import json
import random
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import httpx
import openai
import pytest

from .conftest import serve

pytestmark = pytest.mark.slow

MiB = 1 << 20
CAP_MB, UPLOAD_MB = 4, 8
HEALTHY_S = 2.0  # generous: /health answers in milliseconds when the loop is free


@pytest.fixture(scope="module")
def srv(async_engine, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    data = tmp_path_factory.mktemp("faults-input")
    app = create_app(Settings(data_dir=data, database_url=f"sqlite:///{data}/mainspring.db", max_request_mb=CAP_MB,
                              max_upload_mb=UPLOAD_MB), engine=async_engine)
    with serve(app, async_engine) as s:
        yield s


@contextmanager
def health_watch(url: str) -> Iterator[list[float]]:
    """Polls /health in a thread for the duration of the block; yields the latencies measured."""
    latencies: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                t = time.monotonic()
                assert client.get(f"{url}/health").status_code == 200
                latencies.append(time.monotonic() - t)
                time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield latencies
    finally:
        stop.set()
        thread.join(timeout=60)


def chat_body(content: str | bytes, model: str = "smollm2") -> bytes:
    content = content.encode() if isinstance(content, str) else content
    return b'{"model": "' + model.encode() + b'", "max_tokens": 1, "messages": [{"role": "user", "content": "' \
        + content + b'"}]}'


def chunks(data: bytes, size: int = 256 << 10, pause_s: float = 0.0) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]
        if pause_s:
            time.sleep(pause_s)


def assert_too_large(r: httpx.Response, anthropic: bool = False) -> None:
    assert r.status_code == 413, r.text
    body = r.json()
    if anthropic:
        assert body["type"] == "error" and body["error"]["type"] == "request_too_large"
    else:
        assert body["error"]["code"] == "request_too_large" and body["error"]["type"] == "invalid_request_error"
        assert "MAINSPRING_MAX_" in body["error"]["message"]


# ---- the cap ---------------------------------------------------------------------------------------------------
def test_a_body_over_the_cap_is_413_by_content_length_and_by_chunks(srv):
    big = chat_body(b"a" * (CAP_MB * MiB + 1))
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        assert_too_large(http.post("/v1/chat/completions", content=big, headers=headers))
        assert_too_large(http.post("/v1/chat/completions", content=chunks(big), headers=headers))  # chunked
        assert_too_large(http.post("/v1/messages", content=big, headers=headers), anthropic=True)
        assert_too_large(http.post("/v1/runs", content=chunks(big), headers=headers))
        assert http.post("/v1/chat/completions", content=chat_body("hi"), headers=headers).status_code == 200
    client = openai.OpenAI(base_url=srv.openai_url, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "a" * CAP_MB * MiB}])
    assert e.value.status_code == 413 and e.value.code == "request_too_large"


def test_health_stays_fast_while_a_50_mb_body_is_refused(srv):
    big = chat_body(b"a" * (50 * MiB))
    with health_watch(srv.url) as latencies, httpx.Client(base_url=srv.url, timeout=120) as http:
        assert_too_large(http.post("/v1/chat/completions", content=big))
        assert_too_large(http.post("/v1/chat/completions", content=chunks(big, 1 * MiB)))
    assert latencies and max(latencies) < HEALTHY_S, latencies


def multipart(data: bytes, boundary: str = "mainspring-test-boundary") -> tuple[bytes, dict]:
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nuser_data\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    return (head + data + f"\r\n--{boundary}--\r\n".encode(),
            {"content-type": f"multipart/form-data; boundary={boundary}"})


def test_health_stays_fast_while_a_large_upload_streams_in(srv):
    line = b"a line of a large text file\n"
    fits, headers = multipart(line * ((UPLOAD_MB - 1) * MiB // len(line)))
    too_big, _ = multipart(line * ((UPLOAD_MB + 1) * MiB // len(line)))
    with health_watch(srv.url) as latencies, httpx.Client(base_url=srv.url, timeout=120) as http:
        up = http.post("/v1/files", content=chunks(fits, pause_s=0.03), headers=headers)  # ~1 s in flight
        assert up.status_code == 200, up.text
        assert up.json()["bytes"] > (UPLOAD_MB - 2) * MiB
        assert_too_large(http.post("/v1/files", content=chunks(too_big), headers=headers))
        assert_too_large(http.post("/v1/files", content=too_big, headers=headers))
    assert len(latencies) >= 5 and max(latencies) < HEALTHY_S, latencies


def test_a_long_prompt_is_tokenized_off_the_event_loop(srv):
    words = ["alpha", "beta", "gamma", "delta", "quantum", "river", "stone", "Mainspring", "42", "über"]
    rng = random.Random(0)
    prompt = " ".join(rng.choice(words) for _ in range(int(3.5 * MiB) // 6))  # seconds of tokenizer work
    with health_watch(srv.url) as latencies, httpx.Client(base_url=srv.url, timeout=120) as http:
        r = http.post("/v1/chat/completions", json={"model": "smollm2", "messages": [{"role": "user",
                                                                                    "content": prompt}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert latencies and max(latencies) < HEALTHY_S, latencies


# ---- text that is not Unicode ------------------------------------------------------------------------------------
LONE = [b"a\\ud800b", b"\\udfff", b"x\\uDBFFy\\u0041", b"\xed\xa0\x80"]  # JSON escapes, and CESU-8 bytes


@pytest.mark.parametrize("text", LONE)
def test_a_lone_surrogate_in_message_content_is_a_400_naming_the_field(srv, text):
    r = httpx.post(f"{srv.openai_url}/chat/completions", content=chat_body(text),
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "messages[0].content"
    assert err["code"] == "invalid_unicode"


def test_lone_surrogates_are_a_400_on_every_route_and_in_any_field(srv):
    def post(path: str, body: bytes) -> httpx.Response:
        return httpx.post(f"{srv.url}{path}", content=body, headers={"content-type": "application/json"})

    r = post("/v1/chat/completions", chat_body("hi", model="smol\\ud800"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = post("/v1/completions", b'{"model": "smollm2", "prompt": ["ok", "\\udc00"]}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt[1]"
    r = post("/v1/messages", b'{"model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", '
                             b'"content": [{"type": "text", "text": "\\ud800"}]}]}')
    assert r.status_code == 400 and r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": r.json()["error"]["message"]}}
    r = post("/v1/agents", b'{"name": "a", "instructions": "be \\ud83d nice"}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "instructions"
    r = post("/v1/embeddings", b'{"model": "all-MiniLM-L6-v2", "input": "\\ud800"}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = post("/v1/chat/completions", chat_body("hi")[:-1] + b', "\\ud800key": 1}')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_unicode"


def test_surrogate_pairs_are_fine_and_deep_nesting_is_a_400(srv):
    r = httpx.post(f"{srv.openai_url}/chat/completions", content=chat_body("smile \\ud83d\\ude00"),
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    deep = b'{"model": "smollm2", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{srv.openai_url}/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = httpx.post(f"{srv.openai_url}/chat/completions", content=deep.replace(b"[]", b'["\\ud800"]'),
                   headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_a_batch_line_with_a_lone_surrogate_is_an_error_line_not_a_failed_batch(tmp_path):
    from mainspring.api.batch_lines import plan_batch

    lines = [{"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}},
             {"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "messages": [{"role": "user", "content": "\ud800"}]}},
             {"custom_id": "\udc00", "method": "POST", "url": "/v1/chat/completions", "body": {}}]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))  # ensure_ascii: the surrogates are escapes
    plan = plan_batch(path, "/v1/chat/completions")
    assert [line.custom_id for line in plan.lines] == ["ok"]
    assert [(r["custom_id"], r["error"]["code"]) for r in plan.invalid] == [("bad", "invalid_unicode"),
                                                                             (None, "invalid_unicode")]
    json.dumps(plan.invalid, ensure_ascii=False).encode("utf-8")  # the output file can be written


def test_long_texts_tokenize_to_the_same_ids_on_the_path_that_frees_the_gil(embedded):
    from mainspring.engine.tokenizer import GIL_FREE_CHARS

    tok = embedded.tokenizer
    text = "<|im_start|>user\n" + "Déjà vu 😀, 42 tokens\n\n" * (GIL_FREE_CHARS // 10)
    assert len(text) > GIL_FREE_CHARS
    assert tok.encode(text) == tok._tk.encode(text, add_special_tokens=False).ids
