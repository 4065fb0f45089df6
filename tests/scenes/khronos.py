"""The Khronos glTF-Validator (npm `gltf-validator`), run with node from a project-local prefix.

CI installs it with:  npm install --no-save --prefix .cache/npm gltf-validator@2.0.0-dev.3.10
A test that needs it skips only when node itself is missing; node without the package is a
broken setup and fails with the command to run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

VERSION = "2.0.0-dev.3.10"
PREFIX = Path(__file__).resolve().parents[2] / ".cache" / "npm"
INSTALL = f"npm install --no-save --prefix .cache/npm gltf-validator@{VERSION}"
_SCRIPT = """
const fs = require('fs');
const validator = require(process.argv[1]);
validator.validateBytes(new Uint8Array(fs.readFileSync(process.argv[2])), {maxIssues: 100})
  .then(report => process.stdout.write(JSON.stringify(report)))
  .catch(error => { process.stderr.write(String(error)); process.exit(1); });
"""


def validate_glb(path: Path) -> dict:
    """The validator's report on a .glb file: {"issues": {"numErrors": ..., "messages": [...]}, ...}."""
    node = shutil.which("node")
    if node is None:
        pytest.skip(f"node is not installed, so the Khronos glTF-Validator cannot run (then: {INSTALL})")
    module = PREFIX / "node_modules" / "gltf-validator"
    if not (module / "package.json").is_file():
        pytest.fail(f"the Khronos glTF-Validator is not installed in {PREFIX}; run: {INSTALL}")
    proc = subprocess.run([node, "-e", _SCRIPT, str(module), str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"gltf-validator failed: {proc.stderr}"
    return json.loads(proc.stdout)
