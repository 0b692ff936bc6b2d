"""A real HTTP proxy on loopback, for the network tests: it takes CONNECT requests (what gRPC
and clients of https:// endpoints send) and absolute-form requests (what an HTTP client sends
for an http:// endpoint), connects to the target, and relays bytes both ways. It counts the
connections it relays, with their targets and any Proxy-Authorization. Not a test module."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["ConnectProxy", "Relayed"]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Relayed:
    """One relayed connection: the request's method, the target, its Proxy-Authorization."""

    method: str
    host: str
    port: int
    authorization: str | None


class ConnectProxy:
    """The proxy, listening on 127.0.0.1 at an OS-chosen port from construction to close()."""

    def __init__(self) -> None:
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._relayed: list[Relayed] = []
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="connect-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{LOOPBACK}:{self.port}"

    def relayed(self) -> list[Relayed]:
        """The connections relayed so far."""
        with self._lock:
            return list(self._relayed)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(65536)
            if not chunk:
                client.close()
                return
            head += chunk
        head, _, rest = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        authorization = next(
            (line.split(":", 1)[1].strip() for line in lines[1:]
             if line.lower().startswith("proxy-authorization:")),
            None,
        )  # fmt: skip
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
        else:
            parsed = urlsplit(target)
            host, port = parsed.hostname or "", str(parsed.port or 80)
        try:
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._relayed.append(Relayed(method, host, int(port), authorization))
            self._sockets += [client, upstream]
        if method == "CONNECT":
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if rest:
                upstream.sendall(rest)
        else:  # the request itself, as sent: the receiver takes the absolute form
            upstream.sendall(head + b"\r\n\r\n" + rest)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)

    def close(self) -> None:
        """Stops listening and closes every relayed connection."""
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass

    def __enter__(self) -> ConnectProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copies ``source`` into ``sink`` until either closes, then shuts both down."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    for sock in (source, sink):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
