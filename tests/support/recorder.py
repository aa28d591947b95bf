"""A loopback server that records every request it gets (method, path, Authorization) and
answers as told: the far end of a redirect, or a server that must not be reached."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (status, headers, body) for a path.
Answer = Callable[[str], tuple[int, dict[str, str], bytes]]


@dataclass
class Recorder:
    """What a recording server saw, and its base URL."""

    url: str = ""
    port: int = 0
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)


def ok(path: str) -> tuple[int, dict[str, str], bytes]:
    """A plain 200 for every path."""
    return 200, {"Content-Type": "text/plain"}, b"ok\n"


def redirect_to(base: str) -> Answer:
    """A 302 for every path, to the same path under `base`."""
    return lambda path: (302, {"Location": base + path}, b"")


@contextmanager
def recording(answer: Answer = ok) -> Iterator[Recorder]:
    """Serve on a loopback port, recording each request; yields the recorder."""
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            rec.seen.append((self.command, self.path, self.headers.get("Authorization")))
            status, headers, body = answer(self.path)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _any

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    rec.port = int(server.server_address[1])
    rec.url = f"http://127.0.0.1:{rec.port}"
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
