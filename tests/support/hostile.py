"""A loopback server whose metrics pages misbehave the way real targets do, one per path.

`http://127.0.0.1:PORT/<case>/metrics` serves the case; every case is bounded by the
client's limits, never by the server. Cases: drip (one byte a second), huge (an endless
body), slow_headers (headers one byte at a time), many_series (100,000 distinct series),
big_labels (label values of 1 MB), redirect_loop, gzip_bomb (1 MiB inflating to 1 GiB),
bad_utf8, silent (accepts, reads the request, never answers).
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

CASES = (
    "drip",
    "huge",
    "slow_headers",
    "many_series",
    "big_labels",
    "redirect_loop",
    "gzip_bomb",
    "bad_utf8",
    "silent",
)
OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n"


@cache
def _bomb() -> bytes:
    """1 GiB of zeros, gzip-compressed once (about 1 MiB)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    parts = [comp.compress(zeros) for _ in range(1024)]
    return b"".join(parts) + comp.flush()


@cache
def _many_series(n: int = 100_000) -> bytes:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="m",i="{i}"}} 1' for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


@cache
def _big_labels() -> bytes:
    value = "x" * (1 << 20)
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="{value}"}} 1\n'
    ).encode()


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ", 2)[1].decode()
        case = path.strip("/").split("/")[0]
        await _serve(case, path, writer)
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    except asyncio.CancelledError:
        pass  # the server is shutting down: this case ends here, quietly
    finally:
        writer.close()


async def _serve(case: str, path: str, w: asyncio.StreamWriter) -> None:
    if case == "drip":
        w.write(OK_HEAD + b"content-length: 100000\r\n\r\n")
        for _ in range(100_000):
            w.write(b"#")
            await w.drain()
            await asyncio.sleep(1.0)
    elif case == "huge":
        w.write(OK_HEAD + b"transfer-encoding: chunked\r\n\r\n")
        chunk = b"# " + b"x" * (1 << 20) + b"\n"
        frame = b"%x\r\n%b\r\n" % (len(chunk), chunk)
        for _ in range(8 * 1024):  # 8 GiB if nobody stops reading
            w.write(frame)
            await w.drain()
    elif case == "slow_headers":
        for byte in OK_HEAD + b"x-slow: " + b"y" * 100_000:
            w.write(bytes([byte]))
            await w.drain()
            await asyncio.sleep(0.2)
    elif case in ("many_series", "big_labels", "bad_utf8"):
        if case == "many_series":
            body = _many_series()
        elif case == "big_labels":
            body = _big_labels()
        else:
            body = b'vllm:num_requests_running{model_name="\xff\xfe"} 1\n'
        w.write(OK_HEAD + b"content-length: %d\r\n\r\n" % len(body) + body)
        await w.drain()
    elif case == "redirect_loop":
        w.write(b"HTTP/1.1 302 Found\r\nlocation: %s\r\ncontent-length: 0\r\n\r\n" % path.encode())
        await w.drain()
    elif case == "gzip_bomb":
        body = _bomb()
        w.write(
            OK_HEAD + b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        )
        await w.drain()
    elif case == "silent":
        await asyncio.sleep(3600)


@contextmanager
def hostile() -> Iterator[str]:
    """Serve every case on one loopback port; yields `http://127.0.0.1:PORT`."""
    _bomb(), _many_series(), _big_labels()  # built before the clock of any test starts
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, asyncio.Server] = {}

    async def start() -> None:
        box["server"] = await asyncio.start_server(_handle, "127.0.0.1", 0)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True, name="hostile-server")
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    ready.wait(30)
    server = box["server"]
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:

        async def stop() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
