"""The lean HTTP/1.1 transport against raw asyncio servers: framing, keep-alive, hang-ups."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from probes.load.generator import RequestResult, RequestSpec, new_client, run_open_loop
from probes.vllm.client import Endpoint


def _specs(n: int) -> list[RequestSpec]:
    return [RequestSpec("hello", 16) for _ in range(n)]


async def _raw_server(
    respond: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(respond, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head; its body is read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


def test_transport_reads_chunks_split_anywhere_and_survives_server_hangups() -> None:
    events = [b'data: {"choices":[{"text":"%d","finish_reason":null}]}\n\n' % i for i in range(5)]
    events.append(b"data: [DONE]\n\n")
    body = b"".join(b"%x;ext=1\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\nX-T: 1\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    served = [0]

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        served[0] += 1
        data = head + body
        for i in range(0, len(data), 7):  # 7-byte pieces: every boundary falls somewhere odd
            writer.write(data[i : i + 7])
            await writer.drain()
            await asyncio.sleep(0)
        writer.close()  # a server that hangs up after each answer, keep-alive or not
        await writer.wait_closed()

    async def go() -> list[RequestResult]:
        server, url = await _raw_server(respond)
        out = []
        async with new_client() as client:
            for pause in (0.02, 0.02, 0.0):
                async with client.stream("POST", url, content=b"{}") as resp:
                    assert b"".join([c async for c in resp.aiter_raw()]) == b"".join(events)
                # With a pause the hang-up reaches the idle connection before its reuse;
                # without, the reuse may meet it, and the request goes out on a new one.
                await asyncio.sleep(pause)
            ep = Endpoint(url, "m")
            out = (await run_open_loop(client, ep, _specs(1), [0.0])).records
        server.close()
        return out

    recs = asyncio.run(go())
    assert served[0] == 4
    assert recs[0].status == "ok" and recs[0].output_tokens == 5 and len(recs[0].itl_ms) == 4


def test_transport_content_length_and_bad_answers() -> None:
    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():  # keep-alive: answer requests until the client leaves
            try:
                line = await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            if line.startswith(b"GET /json"):
                writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{"a": true}')
            else:
                writer.write(b"SMTP ready\r\n\r\n")
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def go() -> None:
        server, url = await _raw_server(respond)
        async with new_client() as client:
            for _ in range(2):  # the second reuses the kept-alive connection
                resp = await client.get(url + "/json")
                assert resp.status_code == 200 and resp.json() == {"a": True}
            with pytest.raises(httpx.RemoteProtocolError, match=r"not an HTTP/1\.1 response"):
                await client.get(url + "/other")
        await asyncio.sleep(0.01)  # the server reads the client's goodbye and closes too
        server.close()

    asyncio.run(go())
