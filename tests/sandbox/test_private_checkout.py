"""A checkout in a private directory (a 0700 home, `mktemp -d`): sandboxed code still gets the project runtime,
and the launcher neither loosens the directory's permissions nor leaves its bridge mounted."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import mainspring
from tests.sandbox.conftest import TEST_SANDBOX_DIR

LAUNCHER = textwrap.dedent("""
    import json, os
    import mainspring
    from mainspring.config import Settings
    from mainspring.sandbox import Sandbox

    sandbox = Sandbox(Settings(sandbox_dir={sandbox_dir!r}, sandbox_slots=1))
    job = "import json, mainspring, private_marker; print(json.dumps([mainspring.__file__, private_marker.__file__]))"
    result = sandbox.run(["python3", "-c", job])
    print(json.dumps({{"launcher": mainspring.__file__, "exit": result.exit_code, "stdout": result.stdout,
                      "stderr": result.stderr, "pid": os.getpid()}}))
""")


def private_runtime(home: Path) -> tuple[Path, Path]:
    """A venv and an editable-style checkout under `home`, which only its owner may enter."""
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    deeper = home / "deeper" / "path"
    deeper.mkdir(parents=True)
    venv = deeper / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", purelib],
                               check=True, capture_output=True, text=True).stdout.strip())
    checkout = deeper / "checkout"
    shutil.copytree(Path(mainspring.__file__).parent, checkout / "mainspring",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "private_marker.py").write_text("")
    # .pth files are read in name order: the private checkout comes before this suite's dependencies
    (site / "a_checkout.pth").write_text(f"{checkout}\n")
    (site / "b_dependencies.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    return venv, checkout


def test_sandboxed_code_gets_a_runtime_that_lives_under_a_private_directory(sandbox, tmp_path):
    home = tmp_path / "home-alice"
    venv, checkout = private_runtime(home)
    proc = subprocess.run([str(venv / "bin" / "python"), "-I", "-c", LAUNCHER.format(sandbox_dir=TEST_SANDBOX_DIR)],
                          cwd=home, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["launcher"] == str(checkout / "mainspring" / "__init__.py")  # the private copy, not this one
    assert report["exit"] == 0, report["stderr"]
    package, marker = json.loads(report["stdout"])
    assert package == report["launcher"] and Path(marker).is_relative_to(home)
    assert os.stat(home).st_mode & 0o777 == 0o700  # nothing was loosened to get there
    assert not [p.name for p in Path(TEST_SANDBOX_DIR, "rt").iterdir() if p.name.startswith(f"{report['pid']}-")]
