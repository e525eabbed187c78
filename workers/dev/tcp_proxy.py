"""A TCP proxy that can partition the network: between a worker and a service (Redis) for
the fault tests.

``partition()`` stops every byte in both directions without closing anything -- what a
switch or a firewall dropping packets does: no reset, no FIN, the peers' reads simply wait.
Bytes already sent are held, and ``heal()`` delivers them late, as TCP's retransmissions
would once the path is back: a request the client gave up on may still reach the server
after the client retried it (what idempotent writes must survive).  Connections opened
during the partition are accepted (the SYN got through before, say) but carry nothing.

    with PartitionProxy("127.0.0.1", 6379) as proxy:   # clients use proxy.port
        proxy.partition(); ...; proxy.heal()
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class PartitionProxy:
    """Forwards ``127.0.0.1:<port>`` to ``host:target_port`` until told to partition."""

    def __init__(self, host: str, target_port: int) -> None:
        self.target = (host, target_port)
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def partition(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    @property
    def partitioned(self) -> bool:
        return not self._flowing.is_set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), name="proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        # The partition holds what was read until it heals (never drops, never closes early).
        try:
            while True:
                data = src.recv(65536)
                self._flowing.wait()
                if self._closed.is_set():
                    return
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> PartitionProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["PartitionProxy"]
