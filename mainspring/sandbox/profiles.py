"""Named sandbox profiles: the limits and mounts a kind of job gets.

The built-in profiles can be overridden or extended by a YAML file (`MAINSPRING_SANDBOX_PROFILES_FILE`):

    pytest:
      wall_s: 300
    heavy:            # a new profile; unspecified fields take the defaults below
      memory_mb: 4096
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mainspring.sandbox.errors import SandboxError

MIB = 1 << 20


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    cpu_s: int = Field(10, ge=1, description="CPU seconds per process (SIGXCPU), also the cgroup's share")
    wall_s: float = Field(30, gt=0, description="wall-clock limit; the whole process tree is killed")
    memory_mb: int = Field(512, ge=16, description="memory cgroup limit (RLIMIT_AS without cgroups)")
    cpus: float = Field(1.0, gt=0, description="CPU quota of the cgroup, in cores")
    pids: int = Field(64, ge=4, description="processes and threads at once")
    file_size_mb: int = Field(64, ge=1, description="largest file a process may write")
    open_files: int = Field(256, ge=16)
    output_bytes: int = Field(1 * MIB, ge=1024, description="captured bytes per stream; more kills the job")
    workspace_mb: int = Field(256, ge=1, description="size of the job's tmpfs workspace")
    tmp_mb: int = Field(64, ge=1, description="size of /tmp and /dev/shm each")
    collect_mb: int = Field(16, ge=0, description="total size of output files returned")
    runtime: bool = Field(True, description="the project's Python packages, read-only")
    egl: bool = Field(False, description="allow software EGL rendering (and /dev/dri when present)")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for the job")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * MIB


_EGL_ENV = {"EGL_PLATFORM": "surfaceless", "LIBGL_ALWAYS_SOFTWARE": "1", "GALLIUM_DRIVER": "llvmpipe",
            "LP_NUM_THREADS": "2", "MESA_SHADER_CACHE_DISABLE": "true"}  # no cache files in the workspace

BUILTIN: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(name="python"),
        Profile(name="shell", runtime=False, memory_mb=256),
        Profile(name="pytest", cpu_s=60, wall_s=120, memory_mb=1024, pids=128),
        Profile(name="render", cpu_s=60, wall_s=120, memory_mb=2048, cpus=2.0, pids=128, egl=True, env=_EGL_ENV),
        # Cycles on the CPU: a 1024 px, 64-sample frame of a 16-object room took 84 CPU-s and 1.1 GB on two cores
        # of an AMD EPYC (the render profile's 60 s stopped it); the moderngl ID buffer for the checks runs too
        Profile(name="render_cycles", cpu_s=1800, wall_s=900, memory_mb=4096, cpus=2.0, pids=256, egl=True,
                env=_EGL_ENV),
    )
}


def load_profiles(path: str | Path | None = None) -> dict[str, Profile]:
    """The built-in profiles, with the overrides and additions of a YAML file merged in."""
    profiles = dict(BUILTIN)
    if not path:
        return profiles
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SandboxError(f"cannot read sandbox profiles file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SandboxError(f"sandbox profiles file {path}: expected a mapping of profile name to limits")
    for name, fields in data.items():
        base = profiles.get(name, Profile())
        try:
            profiles[name] = Profile(**{**base.model_dump(), **(fields or {}), "name": name})
        except (ValidationError, TypeError) as exc:
            raise SandboxError(f"sandbox profiles file {path}, profile {name!r}: {exc}") from exc
    return profiles
