"""A small repository for the coding agent's tests: a package with a bug (mean divides by n + 1), a module that
uses it, and tests. Written fresh into each test's tmp_path."""

from __future__ import annotations

from pathlib import Path

BUGGY_MEAN = "    return sum(values) / (len(values) + 1)\n"
FIXED_MEAN = "    return sum(values) / len(values)\n"

FILES = {
    "calc/__init__.py": "",
    "calc/stats.py": (
        "def mean(values: list[float]) -> float:\n"
        '    """The arithmetic mean."""\n'
        + BUGGY_MEAN +
        "\n\n"
        "def spread(values: list[float]) -> float:\n"
        "    return max(values) - min(values)\n"
    ),
    "calc/report.py": (
        "from calc.stats import mean, spread\n\n\n"
        "class Report:\n"
        "    def __init__(self, values: list[float]) -> None:\n"
        "        self.values = values\n\n"
        "    def render(self) -> str:\n"
        '        return f"mean={mean(self.values)} spread={spread(self.values)}"\n'
    ),
    "calc/units.py": (
        "def to_cents(amount: float) -> int:\n"
        "    return round(amount * 100)\n\n\n"
        "def _scale(x: float) -> float:\n"
        "    return x\n"
    ),
    "tests/test_stats.py": (
        "from calc.stats import mean, spread\n\n\n"
        "def test_mean():\n"
        "    assert mean([1, 2, 3]) == 2\n\n\n"
        "def test_spread():\n"
        "    assert spread([1, 5]) == 4\n"
    ),
    "tests/test_report.py": (
        "from calc.report import Report\n\n\n"
        "def test_render():\n"
        '    assert Report([2, 4]).render() == "mean=3.0 spread=2"\n'
    ),
}


def write_repo(root: Path) -> Path:
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root
