"""Review comments on a unified diff: parse the diff, ask a model for {file, line, comment} under a JSON schema,
keep only comments that point into the diff.

    files = parse_diff(text)                          # each file's hunks with new-file line numbers
    comments = await review(model, files)             # a ChatModel: the server's model or an upstream
    print(as_text(comments))                          # "path:line: comment", one a line

The prompt shows every hunk with the new file's line numbers in front of the lines, so the model cites the
numbers it sees. The answer is constrained by a JSON schema (the file an enum of the diff's files, a bounded
number of bounded comments) so it parses and fits max_tokens whatever the model; a model or an upstream that
ignores the schema still gets parsed, and `clip` keeps a comment only where it refers to a hunk of its file.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from mainspring.models.base import ChatModel

MAX_COMMENTS = 10
MAX_COMMENT_CHARS = 300
CLIP_DISTANCE = 3  # a line this close outside a hunk moves onto it; farther, the comment is dropped
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

INSTRUCTIONS = """\
You review a code change. Below is a unified diff: for each file, every line of a hunk with its line number \
in the new file, then `+` for an added line, `-` for a removed one (no number: it is gone) or `|` for context.
Point out bugs, missed edge cases, security problems and unclear code in the added lines. For each, give the \
file, the new line number shown in front of the line, and one or two sentences. Do not comment on lines the \
change does not touch, and give no comment at all when the change is fine."""


class DiffError(ValueError):
    """The text is not a unified diff (the CLI's exit 2)."""


@dataclass
class Hunk:
    new_start: int
    new_count: int
    lines: list[tuple[str, int | None, str]] = field(default_factory=list)  # (kind " +-", new line no., text)

    @property
    def added(self) -> list[int]:
        return [n for kind, n, _ in self.lines if kind == "+" and n is not None]

    @property
    def new_lines(self) -> range:
        """The new file's lines this hunk covers; a hunk that only removes lines covers the line before them."""
        if self.new_count == 0:
            return range(max(self.new_start, 1), max(self.new_start, 1) + 1)
        return range(self.new_start, self.new_start + self.new_count)


@dataclass
class FileDiff:
    path: str  # the new file's path ("b/" dropped); a deleted file's old path
    hunks: list[Hunk] = field(default_factory=list)
    deleted: bool = False

    @property
    def reviewable(self) -> bool:
        return not self.deleted and bool(self.hunks)


@dataclass(frozen=True)
class ReviewComment:
    file: str
    line: int
    comment: str


# ---- parsing -----------------------------------------------------------------------------------------------
def _path(raw: str, prefix: str) -> str | None:
    """A ---/+++ header's path: tab-separated timestamp and quotes dropped, git's a/ or b/ prefix dropped."""
    raw = raw.split("\t", 1)[0].strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        raw = raw[1:-1]
    if raw == "/dev/null":
        return None
    return raw[len(prefix):] if prefix and raw.startswith(prefix) else raw


def parse_diff(text: str) -> list[FileDiff]:
    """The files of a unified diff (git's or `diff -u`'s) with their hunks; DiffError if it has no file header.
    Hunk bodies are read by the header's line counts, so a content line that looks like a header stays content."""
    lines = text.splitlines()
    files: list[FileDiff] = []
    git = any(line.startswith("diff --git ") for line in lines)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = _path(line[4:], "a/" if git else "")
            new = _path(lines[i + 1][4:], "b/" if git else "")
            files.append(FileDiff(new or old or "", deleted=new is None))
            i += 2
            continue
        m = _HUNK.match(line)
        if m and files:
            # "@@ -3 +3 @@": a count left out is 1
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            hunk = Hunk(int(m.group(3)), new_left)
            number = hunk.new_start
            i += 1
            while i < len(lines) and (old_left > 0 or new_left > 0):
                body = lines[i]
                kind, content = (body[:1] or " "), body[1:]
                if kind == "\\":  # "\ No newline at end of file"
                    i += 1
                    continue
                if kind == "-":
                    hunk.lines.append(("-", None, content))
                    old_left -= 1
                elif kind in ("+", " "):
                    hunk.lines.append((kind, number, content))
                    number += 1
                    new_left -= 1
                    old_left -= kind == " "
                else:
                    break  # a truncated hunk: keep what was read
                i += 1
            files[-1].hunks.append(hunk)
            continue
        i += 1
    if not files:
        raise DiffError("not a unified diff: no '--- a/file' / '+++ b/file' header in it")
    return files


# ---- asking the model --------------------------------------------------------------------------------------
def render(files: list[FileDiff]) -> str:
    """The diff as the model sees it: new-file line numbers in front of the lines."""
    out = []
    for f in files:
        if not f.reviewable:
            continue
        out.append(f"=== {f.path}")
        for h in f.hunks:
            out.append("...")
            for kind, n, text in h.lines:
                out.append(f"{n if n is not None else '':>6} {'|' if kind == ' ' else kind} {text}")
    return "\n".join(out)


def comment_schema(files: list[FileDiff], max_comments: int = MAX_COMMENTS) -> dict[str, Any]:
    """The answer's JSON schema: comments on the diff's own files, few and short enough to fit max_tokens."""
    names = [f.path for f in files if f.reviewable]
    item = {"type": "object", "additionalProperties": False, "required": ["file", "line", "comment"],
            "properties": {"file": {"type": "string", "enum": names}, "line": {"type": "integer"},
                           "comment": {"type": "string", "maxLength": MAX_COMMENT_CHARS}}}
    return {"type": "object", "additionalProperties": False, "required": ["comments"],
            "properties": {"comments": {"type": "array", "items": item, "maxItems": max_comments}}}


def max_output_tokens(max_comments: int) -> int:
    # a comment's characters are at least ~1 token per 4; file, line and punctuation ~40 tokens more
    return 64 + max_comments * (MAX_COMMENT_CHARS // 2 + 40)


def parse_answer(content: str) -> list[ReviewComment]:
    """The model's JSON answer as comments; entries of the wrong shape are skipped. ValueError if not JSON."""
    doc = json.loads(content)
    items = doc.get("comments") if isinstance(doc, dict) else doc
    out = []
    for it in items if isinstance(items, list) else []:
        if not isinstance(it, dict):
            continue
        file, line, text = it.get("file"), it.get("line"), it.get("comment")
        if isinstance(line, str) and line.strip().isdigit():
            line = int(line)
        if isinstance(file, str) and isinstance(line, int) and not isinstance(line, bool) and isinstance(text, str):
            out.append(ReviewComment(file, line, text))
    return out


def _normal(path: str) -> str:
    path = path.strip().removeprefix("./")
    return path[2:] if path[:2] in ("a/", "b/") else path


def clip(comments: list[ReviewComment], files: list[FileDiff]) -> list[ReviewComment]:
    """Comments on a hunk of a file of the diff: on a file not in it (or deleted) dropped; a line within
    CLIP_DISTANCE of a hunk moved onto its nearest line; farther from every hunk dropped; empty and repeated
    comments dropped; the text cut at MAX_COMMENT_CHARS."""
    by_path = {f.path: f for f in files if f.reviewable}
    by_path.update({_normal(p): f for p, f in list(by_path.items())})
    out: list[ReviewComment] = []
    for c in comments:
        f = by_path.get(c.file) or by_path.get(_normal(c.file))
        text = " ".join(c.comment.split())[:MAX_COMMENT_CHARS]
        if f is None or not text:
            continue
        best: int | None = None
        for h in f.hunks:
            r = h.new_lines
            near = min(max(c.line, r.start), r.stop - 1)
            if best is None or abs(near - c.line) < abs(best - c.line):
                best = near
        if best is None or abs(best - c.line) > CLIP_DISTANCE:
            continue
        kept = ReviewComment(f.path, best, text)
        if kept not in out:
            out.append(kept)
    return sorted(out, key=lambda c: (c.file, c.line))


async def review(model: ChatModel, files: list[FileDiff], max_comments: int = MAX_COMMENTS,
                 temperature: float = 0.0) -> list[ReviewComment]:
    """Review comments on the diff's files from `model` (ValueError if its answer is not JSON)."""
    schema = comment_schema(files, max_comments)
    messages = [{"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": render(files)}]
    answer = await model.chat(messages, response_format={"type": "json_schema", "json_schema": {
        "name": "review_comments", "schema": schema, "strict": True}},
        max_tokens=max_output_tokens(max_comments), temperature=temperature)
    try:
        comments = parse_answer(answer.text)
    except ValueError as e:
        cut = " (cut at max_tokens)" if answer.finish_reason == "length" else ""
        raise ValueError(f"the model's answer is not JSON{cut}: {answer.text[:200]!r}") from e
    return clip(comments, files)


# ---- output ------------------------------------------------------------------------------------------------
def as_json(comments: list[ReviewComment]) -> str:
    return json.dumps([asdict(c) for c in comments], indent=2, ensure_ascii=False)


def as_text(comments: list[ReviewComment]) -> str:
    return "\n".join(f"{c.file}:{c.line}: {c.comment}" for c in comments)
