"""`mainspring review`: diff parsing (files, new-file line numbers), clipping comments to the diff, the JSON and
text output, exit codes; and one review through a real server on the embedded model (the output's shape only)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from mainspring.scenarios.coding.review import (DiffError, ReviewComment, as_json, as_text, clip, comment_schema,
                                                parse_answer, parse_diff, render, review)
from mainspring.scenarios.coding.review_cli import review_cmd
from tests.scripted_model import ScriptedModel

cli = typer.Typer()
cli.command("review")(review_cmd)
cli.command("unused")(lambda: None)  # two commands, so `review` is a subcommand as under mainspring/cli.py

DIFF = """\
diff --git a/pkg/money.py b/pkg/money.py
index 1111111..2222222 100644
--- a/pkg/money.py
+++ b/pkg/money.py
@@ -1,3 +1,6 @@
 def total(xs):
-    return sum(xs)
+    s = 0
+    for x in xs:
+        s += x
+    return s
 
@@ -20,3 +23,3 @@ def avg(xs):
     n = len(xs)
-    return total(xs) / n
+    return total(xs) // n
     # end
diff --git a/new.py b/new.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/new.py
@@ -0,0 +1,2 @@
+import os
+print(os.getcwd())
diff --git a/old.py b/old.py
deleted file mode 100644
index 4444444..0000000
--- a/old.py
+++ /dev/null
@@ -1,2 +0,0 @@
-x = 1
-y = 2
"""


def invoke(*args: str, input: str | None = None):
    r = CliRunner().invoke(cli, ["review", *args], input=input)
    assert not (r.exception and not isinstance(r.exception, SystemExit)), r.exception  # never a traceback
    return r


# ---- parsing --------------------------------------------------------------------------------------------------
def test_files_and_new_line_numbers():
    money, new, old = parse_diff(DIFF)
    assert (money.path, new.path, old.path) == ("pkg/money.py", "new.py", "old.py")
    assert [h.added for h in money.hunks] == [[2, 3, 4, 5], [24]]
    assert [h.new_lines for h in money.hunks] == [range(1, 7), range(23, 26)]
    assert [(k, n) for k, n, _ in money.hunks[0].lines] == [(" ", 1), ("-", None), ("+", 2), ("+", 3), ("+", 4),
                                                            ("+", 5), (" ", 6)]
    assert new.hunks[0].added == [1, 2] and new.reviewable
    assert old.deleted and not old.reviewable
    shown = render([money, new, old])
    assert "    24 +     return total(xs) // n" in shown and "old.py" not in shown


def test_diff_u_headers_counts_left_out_and_content_that_looks_like_a_header():
    text = ("--- a.py\t2024-01-01 10:00:00\n+++ a.py\t2024-01-02 10:00:00\n@@ -7 +7,2 @@\n--- x\n+++ y\n+z\n"
            "\\ No newline at end of file\n")
    (f,) = parse_diff(text)
    assert f.path == "a.py"  # no git prefixes to drop in `diff -u` output
    assert [(k, n, t) for k, n, t in f.hunks[0].lines] == [("-", None, "-- x"), ("+", 7, "++ y"), ("+", 8, "z")]
    with pytest.raises(DiffError):
        parse_diff("just some text\n")


# ---- clipping and output ---------------------------------------------------------------------------------------
def test_comments_are_clipped_to_the_hunks_of_the_diffs_files():
    files = parse_diff(DIFF)
    raw = [ReviewComment("b/pkg/money.py", 3, "  loop   could be sum() "),  # git's prefix dropped, spaces folded
           ReviewComment("pkg/money.py", 8, "two past the hunk: moved onto its last line"),
           ReviewComment("pkg/money.py", 12, "far from every hunk: dropped"),
           ReviewComment("pkg/money.py", 21, "just before the second hunk"),
           ReviewComment("other.py", 1, "not in the diff"),
           ReviewComment("old.py", 1, "a deleted file"),
           ReviewComment("new.py", 1, ""),
           ReviewComment("./new.py", 2, "x" * 1000),
           ReviewComment("pkg/money.py", 3, "loop could be sum()")]  # the first one again
    assert clip(raw, files) == [ReviewComment("new.py", 2, "x" * 300),
                                ReviewComment("pkg/money.py", 3, "loop could be sum()"),
                                ReviewComment("pkg/money.py", 6, "two past the hunk: moved onto its last line"),
                                ReviewComment("pkg/money.py", 23, "just before the second hunk")]


def test_json_and_text_output():
    comments = [ReviewComment("pkg/money.py", 24, "floor division drops the cents"), ReviewComment("new.py", 2, "ok")]
    assert json.loads(as_json(comments)) == [{"file": "pkg/money.py", "line": 24,
                                              "comment": "floor division drops the cents"},
                                             {"file": "new.py", "line": 2, "comment": "ok"}]
    assert as_text(comments) == "pkg/money.py:24: floor division drops the cents\nnew.py:2: ok"
    assert as_json([]) == "[]" and as_text([]) == ""


def test_answers_of_the_wrong_shape_are_skipped():
    assert parse_answer('{"comments": [{"file": "a", "line": "3", "comment": "c"}, {"file": "a"}, 7]}') == [
        ReviewComment("a", 3, "c")]
    assert parse_answer('[{"file": "a", "line": 1, "comment": "bare array"}]') == [ReviewComment("a", 1, "bare array")]
    with pytest.raises(ValueError):
        parse_answer("not json")


def test_review_asks_under_the_schema_and_clips_the_answer():
    files = parse_diff(DIFF)
    answer = json.dumps({"comments": [{"file": "pkg/money.py", "line": 24, "comment": "// floors"},
                                      {"file": "pkg/money.py", "line": 400, "comment": "nowhere"}]})
    model = ScriptedModel([answer])
    assert asyncio.run(review(model, files, max_comments=3)) == [ReviewComment("pkg/money.py", 24, "// floors")]
    (call,) = model.calls
    fmt = call["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == comment_schema(files, 3)
    assert fmt["json_schema"]["schema"]["properties"]["comments"]["maxItems"] == 3
    assert fmt["json_schema"]["schema"]["properties"]["comments"]["items"]["properties"]["file"]["enum"] == [
        "pkg/money.py", "new.py"]
    assert "    24 + " in call["messages"][-1]["content"]


# ---- exit codes --------------------------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exit_2_on_bad_input(tmp_path, monkeypatch):
    empty = tmp_path / "empty.diff"
    empty.write_text("\n")
    cases = [
        (invoke(str(empty)), "the diff is empty"),
        (invoke("-", input="not a diff\n"), "not a unified diff"),
        (invoke(str(tmp_path / "missing.diff")), "no such file"),
        (invoke("-", "--format", "yaml", input=DIFF), "--format 'yaml'"),
        (invoke("-", "--staged", input=DIFF), "not both"),
        (invoke("-", input="--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"), "no added or changed lines"),
    ]
    for r, message in cases:
        assert r.exit_code == 2 and message in r.stderr, (r.exit_code, r.stderr)


def test_exit_2_outside_a_git_repository_and_on_nothing_staged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path either
    r = invoke("--staged")
    assert r.exit_code == 2 and "not in a git repository" in r.stderr
    subprocess.run(["git", "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    r = invoke("--staged")
    assert r.exit_code == 2 and "the diff is empty" in r.stderr  # a.py is not staged


def test_exit_2_when_the_server_is_unreachable(monkeypatch):
    port = _closed_port()
    r = invoke("-", "--base-url", f"http://127.0.0.1:{port}/v1", input=DIFF)
    assert r.exit_code == 2 and f"no server at http://127.0.0.1:{port}/v1" in r.stderr
    monkeypatch.setenv("MAINSPRING_HOST", "127.0.0.1")
    monkeypatch.setenv("MAINSPRING_PORT", str(port))
    r = invoke("-", "--model", "smollm2", input=DIFF)  # the default: the Mainspring server of the settings
    assert r.exit_code == 2 and f"no server at http://127.0.0.1:{port}/v1" in r.stderr


# ---- through a real server -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(embedded, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from tests.servers import serve

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=128)))
    db = tmp_path_factory.mktemp("review-db") / "mainspring.db"
    try:
        with serve(create_app(Settings(database_url=f"sqlite:///{db}"), engine=engine), engine) as srv:
            yield srv
    finally:
        engine.close()


@pytest.mark.slow
def test_a_staged_change_reviewed_by_the_embedded_model(server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], check=True)
    Path("money.py").write_text("def avg(xs):\n    return sum(xs) // len(xs)\n")
    subprocess.run(["git", "add", "money.py"], check=True)
    r = invoke("--staged", "--format", "json", "--base-url", server.openai_url, "--max-comments", "2")
    assert r.exit_code == 0, r.stderr
    comments = json.loads(r.stdout)
    assert isinstance(comments, list) and len(comments) <= 2
    for c in comments:
        assert set(c) == {"file", "line", "comment"}
        assert c["file"] == "money.py" and c["line"] in (1, 2) and c["comment"]
    r = invoke("--staged", "--base-url", server.openai_url, "--max-comments", "2")
    assert r.exit_code == 0, r.stderr
    for line in r.stdout.splitlines():
        file, number, comment = line.split(":", 2)
        assert file == "money.py" and number in ("1", "2") and comment.startswith(" ") and comment.strip()
