"""The one door to a vLLM engine: every path kvscope calls, its token, its limits, its errors.

`VllmClient` (synchronous: the worker's scrapes, checks and engine supervision) and
`AsyncVllmClient` (probes and the prompt builder) speak `/metrics`, `/health`, `/v1/models`
and `/tokenize`; `Endpoint` is where the load generator sends completions. Both carry the
target's bearer token on every request and turn transport failures into `TargetError`
with a message a person can act on. The HTTP client underneath is injected, so tests hand
in `httpx.MockTransport` or a loopback server.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from planner.errors import NotPrometheusText, TargetAuthError, TargetError
from probes.vllm.metrics import ParsedScrape, parse_metrics
from storage.schemas import normalize_base_url

METRICS = "/metrics"
HEALTH = "/health"
MODELS = "/v1/models"
TOKENIZE = "/tokenize"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"

Api = Literal["completions", "chat"]
MAX_METRICS_BYTES = 16 * 1024 * 1024
SCRAPE_TIMEOUT_S = 3.0
CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Target:
    """Where an engine answers and the bearer token it wants (never printed)."""

    base_url: str
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))

    @classmethod
    def resolve(
        cls, base_url: str, token_env: str | None, environ: Mapping[str, str] | None = None
    ) -> Target:
        """A target whose token is read now from the named variable; unset is an error."""
        if not token_env:
            return cls(base_url)
        token = (os.environ if environ is None else environ).get(token_env)
        if not token:
            raise TargetError(
                f"the target needs a bearer token from ${token_env}, but that variable is not "
                "set in this process' environment"
            )
        return cls(base_url, token)

    @property
    def headers(self) -> dict[str, str]:
        """The auth header, when there is a token."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def url(self, path: str) -> str:
        """The absolute URL of an engine path."""
        return self.base_url + path


@dataclass(frozen=True)
class Endpoint:
    """Where and how the load generator sends: `/v1/completions` or `/v1/chat/completions`.

    `ignore_eos` (a vLLM extension) makes answers exactly `max_tokens` long; `extra` is
    merged into every body (temperature, ...); `headers` carry the target's token.
    """

    base_url: str
    model: str
    api: Api = "completions"
    ignore_eos: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        path = CHAT_COMPLETIONS if self.api == "chat" else COMPLETIONS
        return self.base_url.rstrip("/") + path

    def body(self, prompt: str, max_tokens: int) -> bytes:
        """The JSON body of one streamed request, encoded once before the run."""
        req: dict[str, Any] = {"model": self.model}
        if self.api == "chat":
            req["messages"] = [{"role": "user", "content": prompt}]
        else:
            req["prompt"] = prompt
        req |= {"max_tokens": max_tokens, "stream": True}
        req["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            req["ignore_eos"] = True
        req |= self.extra
        return json.dumps(req, separators=(",", ":")).encode()


def tokenize_body(model: str, text: str, chat: bool) -> dict[str, Any]:
    """A `/tokenize` body counting `text` as a prompt, or as one chat message."""
    if chat:
        return {"model": model, "messages": [{"role": "user", "content": text}]}
    return {"model": model, "prompt": text}


# --- errors: one place turns httpx's failures and HTTP statuses into messages --------------


def transport_error(err: httpx.HTTPError, url: str, timeout: float | None = None) -> TargetError:
    """A TargetError saying what happened, in words a person can act on."""
    if isinstance(err, httpx.TimeoutException):
        within = f" within {timeout:g} s" if timeout is not None else ""
        return TargetError(f"{url} did not answer{within} ({type(err).__name__})")
    if isinstance(err, httpx.ConnectError):
        return TargetError(f"cannot connect to {url}: {_reason(err)}")
    if isinstance(err, httpx.TooManyRedirects):
        return TargetError(f"{url} redirected too many times")
    return TargetError(f"request to {url} failed: {_reason(err)}")


def status_error(status: int, url: str, detail: str = "") -> TargetError:
    """A TargetError for an HTTP error status; 401 and 403 say what to do about the token."""
    if status == 401:
        return TargetAuthError(
            f"{url}: 401: the engine wants a token (set the target's token variable, "
            "e.g. --token-env, to the key the engine was started with)"
        )
    if status == 403:
        return TargetAuthError(f"{url}: 403: the engine refused the token; check its value")
    tail = f": {detail[:300]}" if detail else ""
    return TargetError(f"{url} answered HTTP {status}{tail}")


def _reason(err: Exception) -> str:
    text = str(err) or type(err).__name__
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused (is the engine running on that port?)"
    if "Name or service not known" in text or "nodename nor servname" in text or "Errno -2" in text:
        return "unknown host name"
    return text


def _models(resp: httpx.Response, url: str) -> list[str]:
    if resp.status_code != 200:
        raise status_error(resp.status_code, url)
    try:
        data = resp.json()
    except ValueError as err:
        raise TargetError(
            f"{url} did not answer JSON; is this an OpenAI-compatible server?"
        ) from err
    items = data.get("data", []) if isinstance(data, dict) else []
    return [str(m["id"]) for m in items if isinstance(m, dict) and m.get("id")]


def _parsed(text: str, url: str) -> ParsedScrape:
    try:
        parsed = parse_metrics(text)
    except NotPrometheusText as err:
        raise NotPrometheusText(f"{url}: {err}") from err
    if not parsed.samples and not parsed.cache_info:
        raise NotPrometheusText(
            f"{url} serves Prometheus text but no vLLM metrics (no 'vllm:' names); "
            "is this the engine's URL?"
        )
    return parsed


def _metrics_status(resp: httpx.Response, url: str) -> None:
    if resp.status_code == 404:
        raise TargetError(f"{url} has no metrics endpoint (HTTP 404); is this a vLLM server?")
    if resp.status_code >= 400:
        raise status_error(resp.status_code, url)


class _Body:
    """A body read under a size limit and a deadline for the whole response."""

    def __init__(self, url: str, limit: int, timeout: float) -> None:
        self.url, self.limit, self.timeout = url, limit, timeout
        self.deadline = time.monotonic() + timeout
        self.buf = bytearray()

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > self.limit:
            raise TargetError(
                f"{self.url} sent more than {self.limit / 1024 / 1024:g} MiB; refused "
                "(a /metrics page this big is not vLLM's)"
            )
        if time.monotonic() > self.deadline:
            raise TargetError(f"{self.url} did not finish its answer within {self.timeout:g} s")

    def text(self, encoding: str | None) -> str:
        return bytes(self.buf).decode(encoding or "utf-8", "replace")


# --- the synchronous client ----------------------------------------------------------------


class VllmClient:
    """The worker's side: scrapes, checks and health, one short call at a time."""

    def __init__(self, target: Target, http: httpx.Client) -> None:
        self.target, self.http = target, http

    def metrics_text(
        self, timeout: float = SCRAPE_TIMEOUT_S, limit: int = MAX_METRICS_BYTES
    ) -> str:
        """The `/metrics` body, read within `timeout` in all and at most `limit` bytes."""
        url = self.target.url(METRICS)
        body = _Body(url, limit, timeout)
        try:
            with self.http.stream("GET", url, headers=self.target.headers, timeout=timeout) as resp:
                _metrics_status(resp, url)
                for chunk in resp.iter_bytes():
                    body.add(chunk)
                encoding = resp.encoding
        except httpx.HTTPError as err:
            raise transport_error(err, url, timeout) from err
        return body.text(encoding)

    def scrape(self, timeout: float = SCRAPE_TIMEOUT_S) -> ParsedScrape:
        """Fetch and parse the target's metrics."""
        return _parsed(self.metrics_text(timeout), self.target.url(METRICS))

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether `/health` answers 200."""
        try:
            resp = self.http.get(
                self.target.url(HEALTH), headers=self.target.headers, timeout=timeout
            )
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def models(self, timeout: float = CALL_TIMEOUT_S) -> list[str]:
        """The model ids `/v1/models` lists."""
        url = self.target.url(MODELS)
        try:
            resp = self.http.get(url, headers=self.target.headers, timeout=timeout)
        except httpx.HTTPError as err:
            raise transport_error(err, url, timeout) from err
        return _models(resp, url)


# --- the asynchronous client ---------------------------------------------------------------


class AsyncVllmClient:
    """The probes' side: scrapes during a run, health, the model, token counts, endpoints."""

    def __init__(self, target: Target, http: httpx.AsyncClient) -> None:
        self.target, self.http = target, http

    @property
    def base_url(self) -> str:
        return self.target.base_url

    def endpoint(self, model: str, api: Api = "completions") -> Endpoint:
        """Where the load generator sends completions, with the target's token."""
        return Endpoint(self.target.base_url, model, api=api, headers=self.target.headers)

    async def metrics_text(
        self, timeout: float = CALL_TIMEOUT_S, limit: int = MAX_METRICS_BYTES
    ) -> str:
        """The `/metrics` body, within `timeout` in all and at most `limit` bytes."""
        url = self.target.url(METRICS)
        body = _Body(url, limit, timeout)
        try:
            async with asyncio.timeout(timeout):
                async with self.http.stream(
                    "GET", url, headers=self.target.headers, timeout=timeout
                ) as resp:
                    _metrics_status(resp, url)
                    async for chunk in resp.aiter_bytes():
                        body.add(chunk)
                    encoding = resp.encoding
        except TimeoutError as err:
            raise TargetError(f"{url} did not finish its answer within {timeout:g} s") from err
        except httpx.HTTPError as err:
            raise transport_error(err, url, timeout) from err
        return body.text(encoding)

    async def scrape(self, timeout: float = CALL_TIMEOUT_S) -> ParsedScrape:
        """The target's metrics now, parsed off the event loop (a 50 KB body would stall it)."""
        text = await self.metrics_text(timeout)
        return await asyncio.to_thread(_parsed, text, self.target.url(METRICS))

    async def healthy(self, timeout: float = 5.0) -> bool:
        """Whether `/health` answers 200."""
        try:
            async with asyncio.timeout(timeout):
                resp = await self.http.get(
                    self.target.url(HEALTH), headers=self.target.headers, timeout=timeout
                )
        except (httpx.HTTPError, TimeoutError):
            return False
        return resp.status_code == 200

    async def models(self, timeout: float = CALL_TIMEOUT_S) -> list[str]:
        """The model ids `/v1/models` lists; its status says whether our token is good."""
        url = self.target.url(MODELS)
        try:
            resp = await self.http.get(url, headers=self.target.headers, timeout=timeout)
        except httpx.HTTPError as err:
            raise transport_error(err, url, timeout) from err
        return _models(resp, url)

    async def first_model(self) -> str:
        """The first model listed; a clear error when there is none."""
        ids = await self.models()
        if not ids:
            raise TargetError(f"{self.target.url(MODELS)} lists no model; give --model")
        return ids[0]

    async def count_tokens(self, model: str, text: str, chat: bool = False) -> int | None:
        """Tokens of `text` as the engine counts them; None when it has no `/tokenize`."""
        url = self.target.url(TOKENIZE)
        try:
            resp = await self.http.post(
                url,
                json=tokenize_body(model, text, chat),
                headers=self.target.headers,
                timeout=CALL_TIMEOUT_S,
            )
        except httpx.HTTPError as err:
            raise transport_error(err, url, CALL_TIMEOUT_S) from err
        if resp.status_code in (404, 405, 501):
            return None
        if resp.status_code != 200:
            raise status_error(resp.status_code, url, resp.text)
        try:
            return int(resp.json()["count"])
        except (ValueError, KeyError, TypeError) as err:
            raise TargetError(f"{url} answered without a token count") from err
