"""Ids of rows and API objects: a prefix saying what the thing is, then 96 random bits in hex."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    """`prefix` carries its own separator, as the API's ids do: "run_" gives run_3f2a…, "chatcmpl-" chatcmpl-3f2a…"""
    return prefix + uuid.uuid4().hex[:24]
