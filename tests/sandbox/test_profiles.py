"""Sandbox profiles: built-ins, YAML overrides and additions, and clear errors for bad files."""

import pytest

from mainspring.sandbox.errors import SandboxError
from mainspring.sandbox.profiles import BUILTIN, load_profiles


def test_builtin_profiles_exist_with_their_distinguishing_limits():
    assert set(BUILTIN) == {"python", "pytest", "shell", "render", "render_cycles"}
    assert BUILTIN["render"].egl and BUILTIN["render_cycles"].egl and not BUILTIN["python"].egl
    assert not BUILTIN["shell"].runtime and BUILTIN["pytest"].runtime
    assert BUILTIN["pytest"].wall_s > BUILTIN["python"].wall_s


def test_yaml_overrides_a_builtin_and_adds_a_profile(tmp_path):
    path = tmp_path / "profiles.yaml"
    path.write_text("pytest:\n  wall_s: 300\nheavy:\n  memory_mb: 4096\n")
    profiles = load_profiles(path)
    assert profiles["pytest"].wall_s == 300 and profiles["pytest"].memory_mb == BUILTIN["pytest"].memory_mb
    assert profiles["heavy"].memory_mb == 4096 and profiles["heavy"].name == "heavy"
    assert profiles["python"] == BUILTIN["python"]


@pytest.mark.parametrize("text, match", [
    ("pytest:\n  wall_s: -1\n", "profile 'pytest'"),
    ("pytest:\n  walltime: 5\n", "walltime"),
    ("- a\n- b\n", "mapping"),
    ("pytest: [unclosed\n", "cannot read"),
])
def test_bad_profile_files_say_what_is_wrong(tmp_path, text, match):
    path = tmp_path / "profiles.yaml"
    path.write_text(text)
    with pytest.raises(SandboxError, match=match):
        load_profiles(path)
