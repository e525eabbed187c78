"""Local TCP ports for the services the project starts (brokers, Redis, metrics)."""

from __future__ import annotations

import socket


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound.  SO_REUSEADDR as the servers bind: TIME_WAIT leftovers of
    an earlier server on this port do not count as "in use"; a live listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_run(count: int, host: str = "127.0.0.1") -> int:
    """A first port P with P .. P+count-1 all free (the OS picks P)."""
    for _ in range(50):
        first = find_free_port(host)
        if first + count < 65536 and all(port_is_free(first + i, host) for i in range(count)):
            return first
    raise OSError(f"no {count} consecutive free ports on {host}")
