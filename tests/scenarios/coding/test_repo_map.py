"""The repository map: tags from ast, a task naming a file ranks it and its neighbours first, the token budget is a
hard cap whatever the counter, the output is deterministic, and the tag cache re-parses only changed files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mainspring.scenarios.coding.repo_map import (build_repo_map, estimate_tokens, extract_tags, pagerank,
                                                  python_files, rank)

# a chain ledger -> rates -> rounding, and a busy cluster of files that use each other a lot (which, without a
# task, outranks the chain)
FILES = {
    "money/ledger.py": "from money.rates import convert_amount\n\n\nclass Ledger:\n"
                       "    def post(self, amount, currency):\n        return convert_amount(amount, currency)\n",
    "money/rates.py": "from money.rounding import round_half_even\n\n\ndef convert_amount(amount, currency):\n"
                      "    return round_half_even(amount * 1.1)\n",
    "money/rounding.py": "def round_half_even(x: float, places: int = 2) -> float:\n    return round(x, places)\n",
    "money/lonely.py": "def unused_helper():\n    return 1\n",
    "broken.py": "def oops(:\n",
}
for i in range(6):
    others = [f"hub_function_{j}" for j in range(6) if j != i]
    FILES[f"hub/h{i}.py"] = (f"def hub_function_{i}(value):\n    return value\n\n\ndef caller_{i}():\n"
                             + "".join(f"    {name}(1)\n    {name}(2)\n" for name in others))


@pytest.fixture
def repo(tmp_path) -> Path:
    for rel, text in FILES.items():
        (tmp_path / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "repo" / rel).write_text(text)
    (tmp_path / "repo" / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / "repo" / ".venv" / "lib" / "site.py").write_text("def hidden(): pass\n")
    return tmp_path / "repo"


def test_tags_are_signatures_and_used_names():
    tags = extract_tags("m.py", "import os\nfrom a.b import thing\n\n\nclass Box(Base, metaclass=Meta):\n"
                                "    async def fill(self, *items: int, limit=3) -> None:\n        os.path.join(x)\n\n"
                                "def top(a, b=1, *, c):\n    return Box().fill(a)\n")
    assert [(d.name, d.kind, d.line, d.signature) for d in tags.definitions] == [
        ("Box", "class", 5, "class Box(Base, metaclass=Meta)"),
        ("Box.fill", "method", 6, "    async def fill(self, *items: int, limit=3) -> None"),
        ("top", "function", 9, "def top(a, b=1, *, c)")]
    assert {"thing", "os", "path", "join", "Box", "fill", "x", "a"} <= set(tags.references)
    assert "top" not in tags.references  # defined, never used here
    assert extract_tags("bad.py", "def oops(:\n").definitions == []


def test_hidden_folders_are_not_mapped(repo):
    assert ".venv/lib/site.py" not in python_files(repo) and "money/ledger.py" in python_files(repo)


def test_a_task_naming_a_file_ranks_it_and_its_neighbours_first(repo):
    plain = build_repo_map(repo, "", budget=4000)
    assert plain.files[0].startswith("hub/")  # without a task the busy cluster leads
    m = build_repo_map(repo, "Ledger.post in money/ledger.py loses cents", budget=4000)
    assert m.files[:3] == ["money/ledger.py", "money/rates.py", "money/rounding.py"]
    assert m.text.startswith("money/ledger.py:\n⋮ class Ledger\n⋮     def post(self, amount, currency)\n"
                             "money/rates.py:\n⋮ def convert_amount(amount, currency)\n")
    # naming only the file's stem personalizes the rank too (no forced first place): its neighbours lead
    stem = rank_files(repo, "the rates module converts wrongly")
    assert stem.index("money/rates.py") < stem.index("hub/h0.py")
    assert stem.index("money/rounding.py") < stem.index("hub/h0.py")


def rank_files(repo: Path, task: str) -> list[str]:
    from mainspring.scenarios.coding.repo_map import TagCache

    tags = TagCache(None, repo).tags(repo, python_files(repo))
    r = rank(tags, task)
    return sorted(r.file_rank, key=lambda p: (-r.file_rank[p], p))


@pytest.mark.parametrize("counter", [estimate_tokens, lambda text: 3 * len(text.split()), len])
def test_the_budget_is_a_hard_cap(repo, counter):
    shown = []
    for budget in (0, 5, 17, 40, 90, 200, 400, 100_000):
        m = build_repo_map(repo, "fix money/ledger.py", budget=budget, count_tokens=counter)
        assert counter(m.text) == m.tokens <= budget
        shown.append(m.definitions)
    assert shown == sorted(shown) and shown[0] == 0  # more budget never shows less
    assert shown[-1] == m.total_definitions == 17  # everything fits in a large one (broken.py has none)


def test_the_map_is_deterministic_and_cached_by_mtime(repo, tmp_path):
    cache = tmp_path / "cache"
    first = build_repo_map(repo, "fix money/rates.py", budget=300, cache_dir=cache)
    assert first.parsed_files == len(python_files(repo))
    second = build_repo_map(repo, "fix money/rates.py", budget=300, cache_dir=cache)
    assert second.parsed_files == 0 and second.text == first.text
    assert build_repo_map(repo, "fix money/rates.py", budget=300).text == first.text  # cache or not: same
    target = repo / "money" / "lonely.py"
    target.write_text("def unused_helper():\n    return 1\n\n\ndef added_later(x):\n    return x\n")
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = build_repo_map(repo, "fix money/rates.py", budget=100_000, cache_dir=cache)
    assert third.parsed_files == 1 and "⋮ def added_later(x)" in third.text


def test_pagerank_matches_a_hand_computed_case():
    # two nodes, a -> b only; restart all on a: r_b = 0.85 r_a (+ b's dangling mass goes back to a)
    r = pagerank(["a", "b"], {("a", "b"): 1.0}, {"a": 1.0})
    assert r["b"] == pytest.approx(0.85 * r["a"], rel=1e-6) and sum(r.values()) == pytest.approx(1.0)
    uniform = pagerank(["a", "b", "c"], {}, None)
    assert all(v == pytest.approx(1 / 3) for v in uniform.values())
