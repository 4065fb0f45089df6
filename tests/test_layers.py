"""The layer rules of ARCHITECTURE.md, as the import-linter contracts in pyproject.toml ([tool.importlinter])."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import mainspring

ROOT = Path(__file__).resolve().parents[1]
# Top-level modules outside the layers: the package itself, `python -m mainspring`, the settings-table generator.
OUTSIDE_THE_LAYERS = {"__init__", "__main__", "settings_doc"}


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "COLUMNS": "200"}  # rich wraps the report at the terminal's width otherwise
    done = subprocess.run([str(lint_imports), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_top_level_module_has_a_layer():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    placed = {name.strip().removeprefix("mainspring.") for layer in layers for name in layer.split("|")}
    package = Path(mainspring.__file__).parent
    found = {p.stem for p in package.glob("*.py")} | {p.parent.name for p in package.glob("*/__init__.py")}
    assert found - placed - OUTSIDE_THE_LAYERS == set(), "add these to a layer in pyproject.toml [tool.importlinter]"
