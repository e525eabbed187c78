"""Local TCP ports for the services the project starts (brokers, Redis, metrics)."""

from __future__ import annotations

import random
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


#: Where :func:`free_run` looks: below the OS's ephemeral range (Linux's default 32768-60999),
#: which it also hands to every outgoing connection -- a run taken from that range lost P+1 to
#: a client socket of a parallel test between the check and the broker's bind.
_RUN_PORTS = (10_000, 32_000)


def _ephemeral_start(default: int = 32_768) -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_run(count: int, host: str = "127.0.0.1") -> int:
    """A first port P with P .. P+count-1 all free, below the OS's ephemeral range (where the
    OS hands out no port by itself); from the OS's pick where that range leaves no room."""
    low, high = _RUN_PORTS[0], min(_RUN_PORTS[1], _ephemeral_start()) - count
    rng = random.SystemRandom()
    for _ in range(50):
        first = rng.randrange(low, high) if high > low else find_free_port(host)
        if first + count < 65536 and all(port_is_free(first + i, host) for i in range(count)):
            return first
    raise OSError(f"no {count} consecutive free ports on {host}")
