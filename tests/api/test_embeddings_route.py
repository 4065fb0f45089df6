"""/v1/embeddings driven by the official `openai` SDK against a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from fastapi import FastAPI

from mainspring.api.routes.embeddings import router
from tests.servers import serve


def embeddings_app():
    app = FastAPI()
    app.include_router(router)
    return app


@pytest.fixture(scope="module")
def embed_server():
    app = embeddings_app()
    with serve(app, None) as srv:
        yield app, srv.openai_url


@pytest.fixture(scope="module")
def client(embed_server):
    with openai.OpenAI(base_url=embed_server[1], api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_empty_input_is_400():
    app = embeddings_app()  # its own: the module's server has loaded the model once another test embedded
    with serve(app, None) as srv, openai.OpenAI(base_url=srv.openai_url, api_key="unused", max_retries=0) as client:
        for bad in ("", [], [""], [[]]):
            with pytest.raises(openai.BadRequestError) as e:
                client.embeddings.create(input=bad, model="all-MiniLM-L6-v2", encoding_format="float")
            assert e.value.status_code == 400
    assert getattr(app.state, "embedder", None) is None  # shape errors never load the model


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(input="hi", model="text-embedding-3-small", encoding_format="float")


@pytest.mark.slow
def test_float_and_base64_agree_and_usage(client, embed_server):
    texts = ["The cat sits on the mat.", "A feline rests on a rug.", "Quarterly revenue fell 4%."]
    flt = client.embeddings.create(input=texts, model="all-MiniLM-L6-v2", encoding_format="float")
    # the SDK asks for base64 by default and decodes it into floats itself
    b64 = client.embeddings.create(input=texts, model="text-embedding-all-minilm")
    assert flt.object == "list" and flt.model == "all-MiniLM-L6-v2"
    assert [d.index for d in flt.data] == [0, 1, 2]
    a = np.array([d.embedding for d in flt.data])
    b = np.array([d.embedding for d in b64.data])
    assert a.shape == (3, 384)
    np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)

    embedder = embed_server[0].state.embedder  # cached on the app by the first request
    ours = embedder.embed(texts).numpy()
    np.testing.assert_allclose(a, ours, atol=1e-6)
    assert flt.usage.prompt_tokens == flt.usage.total_tokens == embedder.count_tokens(texts)
    assert flt.usage.prompt_tokens == sum(len(embedder.tokenizer.encode(t).ids) for t in texts)


@pytest.mark.slow
def test_raw_base64_is_little_endian_float32(embed_server):
    import base64

    import httpx

    r = httpx.post(embed_server[1] + "/embeddings", json={"input": "hello world", "model": "all-MiniLM-L6-v2",
                                                    "encoding_format": "base64"}, timeout=120)
    assert r.status_code == 200
    vec = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vec, embed_server[0].state.embedder.embed(["hello world"])[0].numpy(), atol=1e-7)


@pytest.mark.slow
def test_dimensions_truncate_and_renormalize(client, embed_server):
    full = client.embeddings.create(input="graph neural networks", model="all-MiniLM-L6-v2",
                                    encoding_format="float").data[0].embedding
    short = client.embeddings.create(input="graph neural networks", model="all-MiniLM-L6-v2",
                                     encoding_format="float", dimensions=64).data[0].embedding
    assert len(short) == 64
    head = np.array(full[:64])
    np.testing.assert_allclose(short, head / np.linalg.norm(head), atol=1e-6)
    for bad in (0, 385):
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(input="x", model="all-MiniLM-L6-v2", dimensions=bad)


@pytest.mark.slow
def test_token_arrays_are_decoded(client, embed_server):
    embedder = embed_server[0].state.embedder if getattr(embed_server[0].state, "embedder", None) else None
    if embedder is None:
        client.embeddings.create(input="warm up", model="all-MiniLM-L6-v2")
        embedder = embed_server[0].state.embedder
    text = "token arrays work too"
    ids = embedder.tokenizer.encode(text).ids[1:-1]  # word pieces without [CLS]/[SEP]
    one = client.embeddings.create(input=ids, model="all-MiniLM-L6-v2", encoding_format="float")
    many = client.embeddings.create(input=[ids, ids], model="all-MiniLM-L6-v2", encoding_format="float")
    ref = embedder.embed([text])[0].numpy()
    np.testing.assert_allclose(one.data[0].embedding, ref, atol=1e-6)
    assert len(many.data) == 2
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(input=[10**9], model="all-MiniLM-L6-v2")


def test_too_many_inputs_is_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(input=["x"] * 2049, model="all-MiniLM-L6-v2", encoding_format="float")
    assert "2048" in e.value.response.text  # FastAPI detail now, an OpenAI error body once errors.py is wired


LONG = "alpha beta gamma delta " * 100  # 400 words: far more than 256 word pieces


@pytest.mark.slow
def test_long_input_is_a_400_naming_the_limit(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(input=["short", LONG], model="all-MiniLM-L6-v2")
    assert "input[1]" in e.value.response.text and "256" in e.value.response.text
    assert "truncate_prompt_tokens" in e.value.response.text


@pytest.mark.slow
def test_truncate_prompt_tokens(client, embed_server):
    r = client.embeddings.create(input=["short", LONG], model="all-MiniLM-L6-v2", encoding_format="float",
                                 extra_body={"truncate_prompt_tokens": -1})
    embedder = embed_server[0].state.embedder
    assert r.usage.prompt_tokens == 3 + 256  # [CLS] short [SEP], and the long one cut at the model's limit
    np.testing.assert_allclose(r.data[1].embedding, embedder.embed([LONG])[0].numpy(), atol=1e-6)
    cut = client.embeddings.create(input=LONG, model="all-MiniLM-L6-v2", encoding_format="float",
                                   extra_body={"truncate_prompt_tokens": 10})
    assert cut.usage.prompt_tokens == 10
    first_words = " ".join(LONG.split()[:8])  # 8 single-piece words + [CLS] + [SEP]
    np.testing.assert_allclose(cut.data[0].embedding, embedder.embed([first_words])[0].numpy(), atol=1e-5)
    # the temporary cut never leaks into later calls
    assert embedder.count_tokens([LONG]) == 256
    for bad in (0, 257, -2, "all"):
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(input=LONG, model="all-MiniLM-L6-v2", extra_body={"truncate_prompt_tokens": bad})
