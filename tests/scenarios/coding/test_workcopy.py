"""The working copy's diff is one `git apply` accepts: changed, new (empty too) and deleted files, and text
without a final newline."""

from __future__ import annotations

import shutil
import subprocess

from mainspring.scenarios.coding.workcopy import unified_diff


def _tree(root, files: dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _contents(root) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_git_apply_takes_the_diff_of_new_deleted_and_changed_files(tmp_path):
    before = _tree(tmp_path / "before", {"pkg/a.py": "x = 1\n", "pkg/old.py": "gone = True\n", "notes.txt": "end"})
    after = _tree(tmp_path / "after", {"pkg/a.py": "x = 2\n", "pkg/new.py": "def f():\n    return 1\n",
                                       "pkg/empty.py": "", "notes.txt": "end, changed"})
    diff = unified_diff(before, after)
    assert "new file mode 100644" in diff and "deleted file mode 100644" in diff
    target = tmp_path / "target"
    shutil.copytree(before, target)
    done = subprocess.run(["git", "apply", "--check"], cwd=target, input=diff, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    subprocess.run(["git", "apply"], cwd=target, input=diff, text=True, check=True)
    assert _contents(target) == _contents(after)
    assert unified_diff(after, target) == ""  # nothing left over
