"""A lean HTTP/1.1 transport for httpx, for load generation on one core.

Why not httpx's default (httpcore + h11): it costs about 0.9 ms of CPU per 16-token streamed
response and walks its whole pool on every request, so one core tops out near 700 requests/s
with a TTFT overhead above 1 ms; this transport holds about 2000/s at 0.6 ms
(`python -m benchmarks.loadgen --transport httpx` measures the default for comparison).
It does only what a load generator needs: keep-alive, chunked and content-length bodies,
TLS, and a retry when a kept-alive connection was closed. It never follows a redirect.

A request may carry `extensions[RESOLVE]`, an async `(host, port) -> addresses`: the
transport then connects only to those addresses (the vLLM client's allowlist check, so a
name cannot resolve to one address when checked and to another when connected).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import httpx

T = TypeVar("T")
RESOLVE = "kvscope.resolve"
Resolve = Callable[[str, int], Awaitable[list[str]]]


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive for load generation: O(1) connection reuse, no limit on
    connections, and one pass of chunked decoding per socket read.

    Why not httpx's default: httpcore 1.0.9 walks its whole pool (quadratically) on every
    request and h11 handles each chunk as several events, about 0.9 ms of CPU for a
    16-token stream, which caps one core near 500 requests/s and delays first tokens.
    """

    def __init__(self, verify: bool | ssl.SSLContext = True, max_idle: int = 1024) -> None:
        if isinstance(verify, ssl.SSLContext):
            self._ssl: ssl.SSLContext | None = verify
        else:
            self._ssl = ssl.create_default_context()
            if not verify:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        self._idle: dict[tuple[bytes, str, int], list[_Conn]] = {}
        self._max_idle = max_idle

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        https = url.scheme == "https"
        key = (url.raw_scheme, url.host, url.port or (443 if https else 80))
        timeouts = request.extensions.get("timeout", {})
        lines = [request.method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            lines += [name, b": ", value, b"\r\n"]
        lines += [b"\r\n", await request.aread()]
        message = b"".join(lines)
        idle = self._idle.setdefault(key, [])
        while True:
            conn = None
            while idle and conn is None:
                conn = idle.pop()
                if conn.reader.at_eof() or conn.writer.is_closing():
                    conn.close()  # the server hung up while it sat idle
                    conn = None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(request, key, https, timeouts.get("connect"))
            try:
                conn.writer.write(message)
                await conn.writer.drain()
                head = await _timed(conn.reader.readuntil(b"\r\n\r\n"), timeouts.get("read"))
                break
            except (OSError, asyncio.IncompleteReadError) as err:
                conn.close()
                # A kept-alive connection the server closed as we reused it: try a new one.
                if reused and not getattr(err, "partial", b""):
                    continue
                raise _read_error(err, request) from err
            except TimeoutError as err:
                conn.close()
                raise httpx.ReadTimeout("no response head in time", request=request) from err
            except asyncio.LimitOverrunError as err:
                conn.close()
                raise httpx.RemoteProtocolError("response head too long", request=request) from err
            except asyncio.CancelledError:
                conn.close()
                raise
        return self._response(request, conn, head, timeouts.get("read"))

    async def _connect(
        self,
        request: httpx.Request,
        key: tuple[bytes, str, int],
        https: bool,
        timeout: float | None,
    ) -> _Conn:
        resolve: Resolve | None = request.extensions.get(RESOLVE)
        try:
            if resolve is None:
                reader, writer = await _timed(
                    asyncio.open_connection(
                        key[1], key[2], ssl=self._ssl if https else None, limit=1 << 20
                    ),
                    timeout,
                )
            else:
                reader, writer = await _timed(self._open_resolved(resolve, key, https), timeout)
        except TimeoutError as err:
            raise httpx.ConnectTimeout(
                f"no connection within {timeout} s", request=request
            ) from err
        except OSError as err:
            raise httpx.ConnectError(str(err) or type(err).__name__, request=request) from err
        return _Conn(reader, writer, key)

    async def _open_resolved(
        self, resolve: Resolve, key: tuple[bytes, str, int], https: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the first address `resolve` gives that answers (TLS still checks the
        name); what `resolve` raises (a refusal) goes to the caller as is."""
        host, port = key[1], key[2]
        last: OSError | None = None
        for address in await resolve(host, port):
            try:
                return await asyncio.open_connection(
                    address,
                    port,
                    ssl=self._ssl if https else None,
                    server_hostname=host if https else None,
                    limit=1 << 20,
                )
            except OSError as err:
                last = err
        raise last or OSError(f"{host} resolves to no address")

    def _response(
        self, request: httpx.Request, conn: _Conn, head: bytes, read_timeout: float | None
    ) -> httpx.Response:
        lines = head[:-4].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            conn.close()
            raise httpx.RemoteProtocolError(
                f"not an HTTP/1.1 response: {lines[0]!r}", request=request
            )
        headers: list[tuple[bytes, bytes]] = []
        length: int | None = None
        chunked = False
        keep_alive = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip(), value.strip()
            headers.append((name, value))
            low = name.lower()
            if low == b"content-length":
                length = int(value)
            elif low == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif low == b"connection":
                keep_alive = value.lower() != b"close"
        status = int(code)
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            length = 0
        body = _Body(self, conn, request, chunked, None if chunked else length, read_timeout)
        body.keep_alive = keep_alive and (chunked or length is not None)
        extensions = {"http_version": version, "reason_phrase": reason}
        return httpx.Response(status, headers=headers, stream=body, extensions=extensions)

    def _release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self._max_idle and not conn.reader.at_eof():
            idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class _Conn:
    """One TCP (or TLS) connection and the origin it belongs to."""

    __slots__ = ("key", "reader", "writer")

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        key: tuple[bytes, str, int],
    ) -> None:
        self.reader, self.writer, self.key = reader, writer, key

    def close(self) -> None:
        self.writer.close()


class _Body(httpx.AsyncByteStream):
    """A response body read as it arrives: de-chunked, one piece per socket read.

    Only a body read to its end puts the connection back in the pool; one closed early
    closes it.
    """

    def __init__(
        self,
        transport: LeanTransport,
        conn: _Conn,
        request: httpx.Request,
        chunked: bool,
        length: int | None,
        read_timeout: float | None,
    ) -> None:
        self.transport, self.conn, self.request = transport, conn, request
        self.chunked, self.length, self.timeout = chunked, length, read_timeout
        self.keep_alive = False
        self.complete = False
        self.left = 0  # bytes of the current chunk still to come, then its CRLF
        self.crlf = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.length == 0:
            self._finish()
            return
        buf = bytearray()
        remaining = self.length
        reader = self.conn.reader
        while True:
            try:
                data = await _timed(reader.read(1 << 16), self.timeout)
            except TimeoutError as err:
                raise httpx.ReadTimeout("the response stalled", request=self.request) from err
            except OSError as err:
                raise _read_error(err, self.request) from err
            if not data:
                if remaining is None and not self.chunked:
                    self._finish()  # a body delimited by the server closing
                    return
                raise httpx.RemoteProtocolError(
                    "the server closed the connection before the response was complete",
                    request=self.request,
                )
            if self.chunked:
                buf += data
                out, done = self._dechunk(buf)
                if out:
                    yield out
                if done:
                    self._finish()
                    return
            elif remaining is not None:
                yield data[:remaining]
                remaining -= len(data)
                if remaining <= 0:
                    self._finish()
                    return
            else:
                yield data

    def _dechunk(self, buf: bytearray) -> tuple[bytes, bool]:
        """Take every complete piece of chunk data out of `buf`; True once the last chunk ended."""
        out: list[bytes] = []
        pos, done = 0, False
        while True:
            if self.left:
                take = min(self.left, len(buf) - pos)
                out.append(bytes(buf[pos : pos + take]))
                pos += take
                self.left -= take
                if self.left:
                    break
                self.crlf = 2
            if self.crlf:
                skip = min(self.crlf, len(buf) - pos)
                pos += skip
                self.crlf -= skip
                if self.crlf:
                    break
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            try:
                size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            except ValueError as err:
                raise httpx.RemoteProtocolError(
                    "malformed chunked body", request=self.request
                ) from err
            if size == 0:
                # The last chunk: an empty trailer is CRLF, trailer fields end in CRLFCRLF.
                if buf.startswith(b"\r\n", eol + 2) or buf.find(b"\r\n\r\n", eol) >= 0:
                    done, pos = True, len(buf)
                break
            pos = eol + 2
            self.left = size
        del buf[:pos]
        return b"".join(out), done

    def _finish(self) -> None:
        self.complete = True
        if self.keep_alive:
            self.transport._release(self.conn)
        else:
            self.conn.close()

    async def aclose(self) -> None:
        if not self.complete:
            self.complete = True
            self.conn.close()


async def _timed(aw: Awaitable[T], timeout: float | None) -> T:
    """`await aw`, raising TimeoutError after `timeout` seconds (None: no limit)."""
    if timeout is None:
        return await aw
    async with asyncio.timeout(timeout):
        return await aw


def _read_error(err: BaseException, request: httpx.Request) -> httpx.HTTPError:
    if isinstance(err, asyncio.IncompleteReadError):
        return httpx.RemoteProtocolError(
            "the server closed the connection without a complete response head", request=request
        )
    return httpx.ReadError(str(err) or type(err).__name__, request=request)
