"""Fill-in-the-middle on /v1/completions (`suffix`) through the official `openai` SDK against real servers.

The embedded SmolLM2 has no FIM tokens (its vocabulary starts <|endoftext|>, <|im_start|>, <|im_end|>,
<repo_name>, <reponame>, <file_sep>, ...), so there a suffix is a 400. FIM itself is tested on the same weights
with a tokenizer that has StarCoder's markers: three of SmolLM2's unused special tokens renamed <fim_prefix>,
<fim_suffix>, <fim_middle>. The weights never learnt them, so these tests check how the prompt is built, where
generation stops and what the prefix cache reuses, never what the middle says.
"""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from tests.api.test_upstream import oai as upstream_client
from tests.api.test_upstream import stack  # noqa: F401  (the fake upstream behind a server: a fixture)
from tests.servers import serve

pytestmark = pytest.mark.slow

FIM_MARKERS = {3: "<fim_prefix>", 4: "<fim_suffix>", 5: "<fim_middle>"}
MODEL = "SmolLM2-135M-Instruct"
PREFIX = "def mean(xs):\n    \"\"\"The arithmetic mean of a non-empty list.\"\"\"\n    total = "
SUFFIX = "\n    return total / len(xs)\n"


@pytest.fixture(scope="module")
def fim_model(embedded, tmp_path_factory):
    """The embedded model's weights under a tokenizer with StarCoder's FIM markers."""
    from mainspring.engine.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("fim-tokenizer")
    tok = json.loads((embedded.path / "tokenizer.json").read_text(encoding="utf-8"))
    for added in tok["added_tokens"]:
        if added["id"] in FIM_MARKERS:
            del tok["model"]["vocab"][added["content"]]
            added["content"] = FIM_MARKERS[added["id"]]
            tok["model"]["vocab"][added["content"]] = added["id"]
    (folder / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    for name in ("tokenizer_config.json", "config.json", "generation_config.json"):
        (folder / name).write_bytes((embedded.path / name).read_bytes())
    # the same name as the embedded model: the same weights, priced by the same price-sheet entry
    return dataclasses.replace(embedded, tokenizer=Tokenizer.from_dir(folder))


@pytest.fixture(scope="module")
def fim_server(fim_model, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(fim_model, EngineConfig(kv_cache_mb=128)))
    db = tmp_path_factory.mktemp("fim-db") / "mainspring.db"
    app = create_app(Settings(database_url=f"sqlite:///{db}"), engine=engine)
    try:
        with serve(app, engine) as srv:
            yield srv
    finally:
        engine.close()


@pytest.fixture(scope="module")
def fim_oai(fim_server):
    return openai.OpenAI(base_url=fim_server.openai_url, api_key="x", max_retries=0, timeout=120)


def test_fim_format_is_found_only_where_the_vocabulary_has_the_markers(embedded, fim_model):
    from mainspring.engine.fim import fim_format

    assert fim_format(embedded.tokenizer) is None
    fim = fim_format(fim_model.tokenizer)
    assert fim is not None and fim.family == "starcoder"
    assert (fim.prefix_id, fim.suffix_id, fim.middle_id) == (3, 4, 5)
    assert set(fim.stop_ids) == {0, 2}  # StarCoder's <|endoftext|> and the tokenizer's EOS (<|im_end|>)
    assert fim.bos_id is None
    assert fim.prompt_ids([10, 11], [12]) == [3, 10, 11, 4, 12, 5]  # PSM: the prefix first


def test_a_model_without_fim_tokens_answers_400_on_suffix(oai):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            oai.completions.create(model="smollm2", prompt=PREFIX, suffix=SUFFIX, max_tokens=4, stream=stream)
        assert e.value.param == "suffix" and e.value.code == "unsupported_parameter"
        assert "fill-in-the-middle" in e.value.message and "SmolLM2-135M-Instruct" in e.value.message


def test_an_empty_suffix_without_fim_tokens_is_a_plain_completion(oai):
    plain = oai.completions.create(model="smollm2", prompt=PREFIX, temperature=0, max_tokens=6)
    empty = oai.completions.create(model="smollm2", prompt=PREFIX, suffix="", temperature=0, max_tokens=6)
    assert empty.choices[0].text == plain.choices[0].text
    assert empty.usage.prompt_tokens == plain.usage.prompt_tokens


def test_the_prompt_is_prefix_suffix_middle(fim_oai, fim_model):
    tk = fim_model.tokenizer
    psm = [3, *tk.encode(PREFIX), 4, *tk.encode(SUFFIX), 5]
    r = fim_oai.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, temperature=0,
                                   max_tokens=8)
    assert r.usage.prompt_tokens == len(psm)
    (c,) = r.choices
    assert c.finish_reason in ("stop", "length") and r.usage.completion_tokens <= 8
    # the same ids as a plain token prompt continue the same way (greedy): the FIM call built exactly `psm`
    by_ids = fim_oai.completions.create(model=MODEL, prompt=psm, temperature=0, max_tokens=8)
    assert by_ids.choices[0].text.startswith(c.text)


def test_the_middle_ends_at_the_fim_end_token(fim_oai):
    # <|endoftext|> (id 0) forced first: it ends a FIM middle, with its text left out; a plain completion goes on
    bias = {"0": 100}
    fim = fim_oai.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, temperature=0,
                                     max_tokens=5, logit_bias=bias)
    assert fim.choices[0].finish_reason == "stop" and fim.choices[0].text == ""
    assert fim.usage.completion_tokens == 1
    plain = fim_oai.completions.create(model=MODEL, prompt=PREFIX, temperature=0, max_tokens=5,
                                       logit_bias=bias)
    assert plain.choices[0].finish_reason == "length"


def test_stream_matches_non_stream_and_the_fast_variant(fim_oai):
    kw = dict(prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=10)
    plain = fim_oai.completions.create(model=MODEL, **kw)
    chunks = list(fim_oai.completions.create(model=MODEL, stream=True,
                                             stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens
    fast = fim_oai.completions.create(model=MODEL + "-fast", **kw)
    assert fast.model == MODEL + "-fast" and fast.usage.prompt_tokens == plain.usage.prompt_tokens


def test_a_second_completion_in_the_file_reuses_the_prefix(fim_oai, fim_server, fim_model):
    block = fim_server.engine.engine.config.block_size
    prefix = "".join(f"def f{i}(x):\n    return x * {i} + {i * 7}\n\n" for i in range(40)) + "def g(y):\n    "
    n = 1 + len(fim_model.tokenizer.encode(prefix))  # <fim_prefix> + the file's text before the cursor
    first = fim_oai.completions.create(model=MODEL, prompt=prefix, suffix="\n\nprint(g(2))\n",
                                       temperature=0, max_tokens=4)
    assert first.usage.prompt_tokens_details.cached_tokens < n
    # the cursor moved on in the same file: another suffix, and a few more characters before the cursor
    second = fim_oai.completions.create(model=MODEL, prompt=prefix + "y =", suffix="\n",
                                        temperature=0, max_tokens=4)
    assert second.usage.prompt_tokens_details.cached_tokens >= (n - 1) // block * block - block
    assert second.usage.prompt_tokens_details.cached_tokens > n // 2


def test_several_prompts_an_empty_prefix_and_echo(fim_oai, fim_model):
    r = fim_oai.completions.create(model=MODEL, prompt=["", PREFIX], suffix=SUFFIX, temperature=0,
                                   max_tokens=3)
    n_suffix = len(fim_model.tokenizer.encode(SUFFIX))
    n_prefix = len(fim_model.tokenizer.encode(PREFIX))
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == (3 + n_suffix) + (3 + n_prefix + n_suffix)
    with pytest.raises(openai.BadRequestError) as e:
        fim_oai.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, echo=True, max_tokens=2)
    assert e.value.param == "echo"


def test_an_upstream_model_gets_the_suffix_as_the_client_sent_it(stack):  # noqa: F811
    srv, fake, _ = stack  # the upstream knows what it can do with a suffix; we do not
    r = upstream_client(srv).completions.create(model="remote-chat", prompt="def f(", suffix="):\n", max_tokens=1)
    assert r.choices[0].text == " there"
    assert fake.calls[-1]["body"] == {"model": "fake-gpt", "prompt": "def f(", "suffix": "):\n", "max_tokens": 1}
