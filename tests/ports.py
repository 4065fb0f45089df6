"""A free TCP port on 127.0.0.1, for tests that must name one (a server's --port, torchrun's rendezvous)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
