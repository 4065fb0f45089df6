"""Sandbox errors: a job that cannot start is an error; a job that fails or hits a limit is a Result."""

from __future__ import annotations


class SandboxError(Exception):
    """Bad input to the sandbox (unknown profile, bad file path, oversized inputs)."""


class SandboxUnavailable(SandboxError):
    """This host cannot isolate jobs; the message says what is missing."""
