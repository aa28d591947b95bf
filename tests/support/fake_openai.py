"""A loopback stand-in for vLLM's OpenAI-compatible API, for load generator tests and benchmarks.

Serves `/v1/models`, `/tokenize` and streaming `/v1/completions` and `/v1/chat/completions`
in the chunk shapes vLLM 0.32 sends (tests/fixtures/http), on a raw asyncio protocol so one
core streams thousands of requests a second. Never product code: it generates no text.
Run alone with `python -m tests.support.fake_openai --port 0` (prints its URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

BOS = 1
# Text of the streamed tokens, pre-escaped for the JSON templates below.
WORDS = tuple(json.dumps(w)[1:-1] for w in (" peng", "plaist", " brast", "plot", " cean", "riol"))
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
_REASONS[500] = "Internal Server Error"


def tokenize(text: str) -> list[int]:
    """BOS plus one token per started 5 characters of each whitespace-separated word."""
    ids = [BOS]
    for word in text.split():
        for i in range(0, len(word), 5):
            ids.append(3 + zlib.crc32(word[i : i + 5].encode()) % 32000)
    return ids


def chat_tokens(messages: list[dict[str, Any]]) -> int:
    """Prompt tokens of a chat: BOS, 3 template tokens per message, 2 to open the answer."""
    return sum(len(tokenize(str(m.get("content") or ""))) - 1 + 3 for m in messages) + 3


@dataclass
class FakeConfig:
    """How the fake behaves; change fields between requests from the test thread."""

    model: str = "tiny-llama"
    max_model_len: int = 8192
    ttft_s: float = 0.0  # prompt arrival to first token
    itl_s: float = 0.0  # between streamed tokens
    error_every: int = 0  # every n-th generation request answers HTTP 500
    tokenize_endpoint: bool = True  # False: /tokenize is 404, as on non-vLLM servers
    keep_bodies: bool = False  # keep every generation request body (tests inspect prompts)
    metrics: bool = False  # serve a minimal vLLM-style /metrics (idle gauges, no histograms)
    # Refuse every request without `Authorization: Bearer <api_key>` (vLLM's --api-key
    # guards its /v1 routes; this stand-in guards all of them, so a forgotten token shows).
    api_key: str | None = None
    # A prompt over this many tokens "crashes" the engine for `down_s`: its health answers
    # 503 and every generation 500 until then (the OOM probe's crash and restart).
    crash_over_tokens: int | None = None
    down_s: float = 1.0
    # A prompt over this many tokens counts one preemption (the OOM probe's verdict).
    preempt_over_tokens: int | None = None
    metrics_delay_s: float = 0.0  # /metrics answers this late (a busy engine's API server)
    # A prompt over this many tokens leaves one request waiting with one block free of 64
    # until a shorter one comes (vLLM queueing a sequence the cache cannot hold).
    queue_over_tokens: int | None = None
    # Answers stream one after another, never two at once (a scheduler handed the requests
    # so far apart that each is done before the next begins).
    one_at_a_time: bool = False


@dataclass
class FakeOpenAI:
    """A running fake: its URL, its config, and what it has seen."""

    config: FakeConfig
    url: str = ""
    generations: int = 0
    unauthorized: int = 0
    down_until: float = 0.0  # monotonic
    crashes: list[float] = field(default_factory=list)  # monotonic times of each crash
    preemptions: int = 0
    queued: bool = False  # queue_over_tokens: one request waits for KV space now
    sent: list[tuple[float, int]] = field(default_factory=list)  # (time, prompt tokens)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    tokenized: list[float] = field(default_factory=list)  # monotonic times of /tokenize calls
    # Open connections and answers still streaming, so a shutdown leaves nothing behind.
    connections: set[_Connection] = field(default_factory=set)
    streams: set[asyncio.Task[None]] = field(default_factory=set)
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)  # one_at_a_time's

    def respond(
        self, method: str, path: str, body: bytes, auth: str | None = None
    ) -> tuple[int, bytes, list[bytes] | None]:
        """Status and JSON body, or status and SSE events to stream, for one request."""
        cfg = self.config
        if cfg.api_key is not None and auth != f"Bearer {cfg.api_key}":
            self.unauthorized += 1
            return 401, b'{"error":"Unauthorized"}', None
        if method == "GET" and path == "/v1/models":
            card: dict[str, Any] = {"id": cfg.model, "object": "model", "owned_by": "vllm"}
            # `vllm bench serve` without --model reads the id and `root` of the first model.
            card |= {"root": cfg.model, "max_model_len": cfg.max_model_len}
            return 200, json.dumps({"object": "list", "data": [card]}).encode(), None
        if method == "GET" and path == "/health":
            return (503 if time.monotonic() < self.down_until else 200), b"", None
        if method == "GET" and path == "/metrics" and cfg.metrics:
            waiting, usage = (1, 1 - 1 / 63) if self.queued else (0, 0.0)
            text = (
                f'vllm:num_requests_running{{model_name="{cfg.model}"}} 0.0\n'
                f'vllm:num_requests_waiting{{model_name="{cfg.model}"}} {waiting}\n'
                f'vllm:kv_cache_usage_perc{{model_name="{cfg.model}"}} {usage}\n'
                f'vllm:num_preemptions_total{{model_name="{cfg.model}"}} {self.preemptions}\n'
            )
            if cfg.queue_over_tokens is not None:
                text += (
                    f'vllm:cache_config_info{{block_size="16",model_name="{cfg.model}",'
                    'num_gpu_blocks="64"} 1.0\n'
                )
            return 200, text.encode(), None
        if method != "POST":
            return 404, b'{"detail":"Not Found"}', None
        req = json.loads(body or b"{}")
        if path == "/tokenize" and cfg.tokenize_endpoint:
            self.tokenized.append(time.monotonic())
            if "messages" in req:
                ids = list(range(chat_tokens(req["messages"])))
            else:
                ids = tokenize(req.get("prompt", ""))
            out = {"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids}
            out["token_strs"] = None
            return 200, json.dumps(out).encode(), None
        if path == "/v1/completions":
            return self._generate(req, chat=False)
        if path == "/v1/chat/completions":
            return self._generate(req, chat=True)
        return 404, b'{"detail":"Not Found"}', None

    def _generate(self, req: dict[str, Any], chat: bool) -> tuple[int, bytes, list[bytes] | None]:
        cfg = self.config
        self.generations += 1
        if cfg.keep_bodies:
            self.bodies.append(req)
        if cfg.error_every and self.generations % cfg.error_every == 0:
            return 500, _error("injected failure", "InternalServerError", 500), None
        if not req.get("stream"):
            return 400, _error("the fake only streams", "BadRequestError", 400), None
        if chat:
            prompt = chat_tokens(req.get("messages", []))
        else:
            prompt = len(tokenize(str(req.get("prompt", ""))))
        now = time.monotonic()
        self.sent.append((now, prompt))
        if now < self.down_until:
            return 500, _error("engine dead", "InternalServerError", 500), None
        if cfg.preempt_over_tokens is not None and prompt > cfg.preempt_over_tokens:
            self.preemptions += 1
        if cfg.queue_over_tokens is not None:
            self.queued = prompt > cfg.queue_over_tokens
        if cfg.crash_over_tokens is not None and prompt > cfg.crash_over_tokens:
            self.down_until = now + cfg.down_s
            self.crashes.append(now)
            return 500, _error("engine dead", "InternalServerError", 500), None
        if prompt > cfg.max_model_len:
            n = cfg.max_model_len + 1
            msg = (
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"your prompt contains at least {n} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={n})"
            )
            return 400, _error(msg, "BadRequestError", 400, "input_tokens"), None
        # vLLM 0.32 shortens max_tokens to what still fits (tests/fixtures/http).
        out = min(int(req.get("max_tokens") or 16), cfg.max_model_len - prompt)
        return 200, b"", _events(self.generations, cfg.model, chat, prompt, out)


def _error(message: str, kind: str, code: int, param: str | None = None) -> bytes:
    err = {"message": message, "type": kind, "param": param, "code": code}
    return json.dumps({"error": err}).encode()


def _events(n: int, model: str, chat: bool, prompt: int, out: int) -> list[bytes]:
    """Every SSE event of one streamed answer, `data: ...\\n\\n` each."""
    created = int(time.time())
    if chat:
        head = f'{{"id":"chatcmpl-{n}","object":"chat.completion.chunk","created":{created},'
        head += f'"model":"{model}","choices":['
        role = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        chunks = [head + role + '"finish_reason":null}],"prompt_token_ids":null}']
        tok = '{"index":0,"delta":{"content":"%s"},"logprobs":null,"finish_reason":%s,'
        tok += '"token_ids":null}]}'
    else:
        head = f'{{"id":"cmpl-{n}","object":"text_completion","created":{created},'
        head += f'"model":"{model}","choices":['
        chunks = []
        tok = '{"index":0,"text":"%s","logprobs":null,"finish_reason":%s,"stop_reason":null,'
        tok += '"prompt_token_ids":null,"token_ids":null}]}'
    for i in range(out):
        reason = '"length"' if i == out - 1 else "null"
        chunks.append(head + tok % (WORDS[i % len(WORDS)], reason))
    usage = f'"usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt + out},'
    usage += f'"completion_tokens":{out}}},"system_fingerprint":"vllm-0.32.0-fake"}}'
    chunks.append(head + "]," + usage)
    chunks.append("[DONE]")
    return [b"data: " + c.encode() + b"\n\n" for c in chunks]


class _Connection(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; one request at a time per connection (no pipelining)."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.fake.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fake.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            length, close, auth = 0, False, None
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection":
                    close = value.strip().lower() == "close"
                elif name == "authorization":
                    auth = value.strip()
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            self._answer(method, path, body, close, auth)

    def _answer(self, method: str, path: str, body: bytes, close: bool, auth: str | None) -> None:
        assert self.transport is not None
        status, payload, events = self.fake.respond(method, path, body, auth)
        chat = path == "/v1/chat/completions"
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        if events is None:
            head += f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
            answer = (head + _conn(close)).encode() + payload
            delay = self.fake.config.metrics_delay_s if path == "/metrics" else 0.0
            if delay > 0:
                asyncio.get_running_loop().call_later(delay, self._write, answer, close)
            else:
                self._write(answer, close)
            return
        head += "content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n"
        head += _conn(close)
        cfg = self.fake.config
        if cfg.ttft_s <= 0 and cfg.itl_s <= 0 and not cfg.one_at_a_time:
            self._write(head.encode() + b"".join(map(_chunk, events)) + b"0\r\n\r\n", close)
        else:
            task = asyncio.get_running_loop().create_task(
                self._stream(head.encode(), events, 1 if chat else 0, cfg, close)
            )
            self.fake.streams.add(task)
            task.add_done_callback(self.fake.streams.discard)

    def _write(self, answer: bytes, close: bool) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return  # the client gave up waiting
        self.transport.write(answer)
        if close:
            self.transport.close()

    async def _stream(
        self, head: bytes, events: list[bytes], first: int, cfg: FakeConfig, close: bool
    ) -> None:
        """Send the events with the configured delays; stop when the client hangs up.

        `first` is the index of the first token event (chat sends a role chunk before it);
        the usage chunk and [DONE] follow the last token at once.
        """
        if cfg.one_at_a_time:
            async with self.fake.turn:
                await self._send(head, events, first, cfg, close)
        else:
            await self._send(head, events, first, cfg, close)

    async def _send(
        self, head: bytes, events: list[bytes], first: int, cfg: FakeConfig, close: bool
    ) -> None:
        assert self.transport is not None
        self.transport.write(head)
        await asyncio.sleep(cfg.ttft_s)
        for i, event in enumerate(events):
            if first < i < len(events) - 2 and cfg.itl_s > 0:
                await asyncio.sleep(cfg.itl_s)
            if self.transport.is_closing():
                return
            self.transport.write(_chunk(event))
        self.transport.write(b"0\r\n\r\n")
        if close:
            self.transport.close()


def _conn(close: bool) -> str:
    return "connection: close\r\n\r\n" if close else "connection: keep-alive\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def start(fake: FakeOpenAI, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Listen on the running loop; sets `fake.url`."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(fake), host, port, backlog=4096)
    fake.url = f"http://{host}:{server.sockets[0].getsockname()[1]}"
    return server


async def stop(fake: FakeOpenAI, server: asyncio.Server) -> None:
    """Stop listening, drop every connection and answer, and let the loop close them."""
    server.close()
    for task in list(fake.streams):
        task.cancel()
    for conn in list(fake.connections):
        if conn.transport is not None:
            conn.transport.abort()
    for _ in range(3):
        await asyncio.sleep(0)


@contextmanager
def serve(config: FakeConfig | None = None) -> Iterator[FakeOpenAI]:
    """Run a fake on its own loop in a background thread; yields it (its `url` is set)."""
    fake = FakeOpenAI(config or FakeConfig())
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(start(fake), loop).result(timeout=10)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(stop(fake, server), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def main() -> None:
    """Serve until killed; the first stdout line is the URL."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    parser.add_argument("--max-model-len", type=int, default=8192)
    args = parser.parse_args()
    fake = FakeOpenAI(
        FakeConfig(
            ttft_s=args.ttft_ms / 1000, itl_s=args.itl_ms / 1000, max_model_len=args.max_model_len
        )
    )

    async def run() -> None:
        server = await start(fake, port=args.port)
        print(fake.url, flush=True)
        await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
