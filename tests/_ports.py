"""Free loopback ports for tests and benches that bind ZeroMQ sockets on 127.0.0.1.

A plain module (no pytest plugin needed), so SGLang's virtualenv, which lacks
pytest-timeout, imports it too.
"""

from __future__ import annotations

import random
import socket

__all__ = ["free_port_block"]


def free_port_block(n: int) -> int:
    """A base port with ``n`` consecutive free ports on 127.0.0.1 (dp ranks are base + rank)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 60_000)
        probes = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                probes.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in probes:
                s.close()
    msg = "no block of free ports"
    raise RuntimeError(msg)
