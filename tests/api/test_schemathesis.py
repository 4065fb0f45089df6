"""Property-based API fuzzing: schemathesis (4.x) generates requests from the live server's
/openapi.json for every operation, valid ones and invalid ones, and no answer may be a 5xx.

The server runs a deliberately small engine (64 MB of KV cache, a 256-token context) on its own
database, so random prompts stay short and random `max_tokens` are clamped by the context. The
schema types several fields loosely (model and role are plain strings), so most generated values are
steered to valid ones (see `steer`) to reach the code behind the first check, and counts that only
multiply the work of a valid request (choices, output tokens) are lowered. No operation is excluded:
only the status is checked, so streamed (text/event-stream) answers need no parsing. Every request
has a 60 s timeout (a hung request fails the test); no shrinking, since each example is a real call.
About a minute on 2 cores; MAINSPRING_FUZZ_SCALE=10 runs ten times the examples.
"""

from __future__ import annotations

import os
import time
import zlib
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from mainspring.embeddings import MODEL_NAME as EMBEDDING_MODEL

from .conftest import serve

pytestmark = pytest.mark.slow

SCALE = int(os.environ.get("MAINSPRING_FUZZ_SCALE", "1"))
EXAMPLES = {GenerationMode.POSITIVE: 20 * SCALE, GenerationMode.NEGATIVE: 10 * SCALE}
REQUEST_TIMEOUT_S = 60
ROLES = ("user", "assistant", "system", "tool", "developer")
CAPS = {"n": 2, "best_of": 2, "max_tokens": 8, "max_completion_tokens": 8, "max_output_tokens": 8,
        "min_tokens": 8}  # work multipliers


@pytest.fixture(scope="module")
def target(embedded, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=64, max_model_len=256)))
    db = tmp_path_factory.mktemp("schemathesis") / "db.sqlite"
    app = create_app(Settings(database_url=f"sqlite:///{db}"), engine=engine)
    try:
        with serve(app, engine) as srv:
            yield srv
    finally:
        engine.close()


def mostly(value: object) -> bool:
    """Three in four, decided by the generated value itself (so a failing example replays the same)."""
    return zlib.crc32(repr(value).encode("utf-8", "surrogatepass")) % 4 != 0


def steer(case, llm: str, vocab_size: int) -> None:
    """Make most generated requests reach the work behind the route, then bound that work.

    The schema types several fields only as "string" or "any", so purely random values are rejected
    at the first check (a 404 model, an unknown role, token ids outside the vocabulary) and the code
    behind it never runs. Most such values are replaced by valid ones; the rest still test the checks.
    Counts that only multiply the work of a valid request are lowered; invalid ones are left to fail."""
    body = case.body
    if not isinstance(body, dict):
        return
    model = body.get("model")
    if isinstance(model, str) and mostly(model):
        body["model"] = EMBEDDING_MODEL if case.operation.path == "/v1/embeddings" else llm
    for m in body.get("messages") if isinstance(body.get("messages"), list) else []:
        role = m.get("role") if isinstance(m, dict) else None
        if isinstance(role, str) and role not in ROLES and mostly(role):
            m["role"] = ROLES[len(role) % len(ROLES)]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and mostly(prompt):
        body["prompt"] = [[t % vocab_size for t in p] if isinstance(p, list) and all(_is_int(t) for t in p)
                          else p % vocab_size if _is_int(p) else p for p in prompt]
    if case.operation.path == "/v1/embeddings" and "input" not in body and mostly(body):
        body["input"] = "a short sentence to embed"
    if case.operation.path == "/v1/chat/completions" and not {"max_tokens", "max_completion_tokens"} & set(body) \
            and mostly(body):  # absent means "the rest of the context": ~250 tokens of decoding
        body["max_tokens"] = CAPS["max_tokens"]
    if case.operation.path == "/v1/responses":  # input may be absent (previous_response_id), but is not here
        if "input" not in body and mostly(body):
            body["input"] = "a short question"
        if "max_output_tokens" not in body and mostly(body):
            body["max_output_tokens"] = CAPS["max_output_tokens"]
    for name, cap in CAPS.items():
        v = body.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > cap and v == int(v) \
                and (name.endswith("_tokens") or v <= 128):
            body[name] = cap


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def test_no_operation_answers_with_a_server_error(target):
    schema = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    llm, vocab_size = target.engine.engine.name, target.engine.engine.model_config.vocab_size
    failures: list[str] = []
    ran: list[str] = []
    for result in schema.get_all_operations():
        try:
            op = result.ok()
        except Exception:  # noqa: BLE001 (an operation whose schema schemathesis cannot use is a failure too)
            failures.append(f"unusable operation in /openapi.json: {result.err()}")
            continue
        for mode, examples in EXAMPLES.items():
            # no shrinking: every example is a real request, and the failing one is reported as curl
            @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case) -> None:
                steer(case, llm, vocab_size)
                response = case.call(base_url=target.url, timeout=REQUEST_TIMEOUT_S)
                statuses[response.status_code] += 1  # noqa: B023 (run() is called within this iteration)
                try:
                    case.validate_response(response, checks=[not_a_server_error])
                except Exception as exc:
                    raise AssertionError(f"{exc}\n{case.as_curl_command(base_url=target.url)}\n"
                                         f"-> {response.status_code} {response.text[:500]}") from None

            started, statuses = time.monotonic(), Counter()
            try:
                run()
            except Unsatisfiable:  # nothing can be invalid (no parameters, or any string is a valid id)
                assert mode is GenerationMode.NEGATIVE, op.label
            except Exception as exc:  # noqa: BLE001 (collected: one report for every operation)
                failures.append(f"{op.label} [{mode.value}]: {exc}")
            ran.append(f"{op.label} [{mode.value}] {time.monotonic() - started:.1f}s {dict(sorted(statuses.items()))}")
    print("\n".join(ran))
    assert len(ran) >= 2 * 7, ran  # every operation of the API ran (models, chat, completions, ... usage)
    assert not failures, "\n\n".join(failures)
