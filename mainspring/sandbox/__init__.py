"""Isolated, least-privilege execution of untrusted code: `Sandbox().run(command, files, profile) -> Result`."""

from mainspring.sandbox.errors import SandboxError, SandboxUnavailable
from mainspring.sandbox.profiles import Profile
from mainspring.sandbox.result import Result
from mainspring.sandbox.sandbox import Sandbox, get_sandbox

__all__ = ["Profile", "Result", "Sandbox", "SandboxError", "SandboxUnavailable", "get_sandbox"]
