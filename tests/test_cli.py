"""The `mainspring` CLI as a user runs it: a real process, the embedded model, exit codes."""

import os
import subprocess
import sys

import httpx
import pytest

from tests.ports import free_port

pytestmark = pytest.mark.slow


def run(*args: str, env: dict | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mainspring", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, input=input, timeout=300)


def test_chat_answers_a_question(embedded):
    proc = run("chat", "-m", "What is the capital of France?", "-n", "24")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


def test_chat_reads_turns_from_stdin(embedded):
    proc = run("chat", "-n", "16", input="What is the capital of France?\nAnd of Italy?\n")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout and "Rome" in proc.stdout


def test_generate_streams_text(embedded):
    proc = run("generate", "The capital of France is", "-n", "8")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip()) > 0


def test_bad_input_exits_2_with_a_message(embedded):
    proc = run("generate", "hi", "--top-p", "2")
    assert proc.returncode == 2 and "top_p" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("generate", "hi", env={"MAINSPRING_MODEL": "/nonexistent/model.gguf"})
    assert proc.returncode == 2 and "/nonexistent/model.gguf" in proc.stderr and "Traceback" not in proc.stderr


def test_up_serves_health_then_down(embedded, tmp_path):
    port = free_port()
    env = {"MAINSPRING_PORT": str(port)}
    proc = run("up", env=env)
    try:
        assert proc.returncode == 0, proc.stderr
        assert f"http://127.0.0.1:{port}" in proc.stdout
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        assert health["status"] == "ok" and health["model"] == "SmolLM2-135M-Instruct"
        fast = health["fast_variant"]  # the weights the -fast engine measured best on this CPU
        assert fast["model"] == "SmolLM2-135M-Instruct-fast" and fast["weights"] in fast["ms_per_step"]
        # int4 layers keep fp32 prefill copies unless bf16 is native: those run the standard engine's linears instead,
        # all 120 (the GGUF's Q4_1 layers are exact in int4 g32)
        from mainspring.engine.quant import native_bf16

        shares = fast["weights"].startswith("int4") and not native_bf16()
        assert fast["prefill_shared_layers"] == (120 if shares else 0)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
        card = next(m for m in models["data"] if m["id"] == "SmolLM2-135M-Instruct-fast")
        assert card["weights"] == fast["weights"] and card["speculative"] != "off"
        again = run("up", env=env)  # idempotent: finds the running server
        assert again.returncode == 0 and "running" in again.stdout
    finally:
        down = run("down", env=env)
    assert down.returncode == 0


def test_malformed_setting_exits_2():
    proc = run("generate", "hi", env={"MAINSPRING_PORT": "abc"})
    assert proc.returncode == 2 and "MAINSPRING_PORT" in proc.stderr and "Traceback" not in proc.stderr


def test_perplexity_scores_a_file_under_a_window_and_dense(embedded):
    proc = run("perplexity", "/usr/share/common-licenses/GPL-3", "--tokens", "400", "--window", "64", "--compare",
               "--json")
    assert proc.returncode == 0, proc.stderr
    import json

    runs = {r["policy"]: r for r in json.loads(proc.stdout)["runs"]}
    dense, windowed = runs["dense fp32"], runs["window 64 + 4 sinks"]
    assert dense["tokens"] == windowed["tokens"] == 400
    assert 1 < dense["ppl"] < windowed["ppl"] < 100  # a 64-token window loses some context
    assert windowed["peak_kv_mb"] < dense["peak_kv_mb"]


def test_perplexity_bad_input_exits_2(embedded, tmp_path):
    proc = run("perplexity", str(tmp_path / "missing.txt"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("perplexity", "/usr/share/common-licenses/BSD", "--window", "8")
    assert proc.returncode == 2 and "--window must be at least 32" in proc.stderr
