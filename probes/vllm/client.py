"""The one door to a vLLM engine: every path kvscope calls, its token, its limits, its errors.

`VllmClient` (synchronous: the worker's scrapes, checks and engine supervision) and
`AsyncVllmClient` (probes and the prompt builder) speak `/metrics`, `/health`, `/v1/models`
and `/tokenize`; `Endpoint` is where the load generator sends completions. Both carry the
target's bearer token on every request and turn transport failures into `TargetError`
with a message a person can act on. The HTTP client underneath is injected, so tests hand
in `httpx.MockTransport` or a loopback server.

Every request obeys the target's allowlist (`storage.outbound`): a host off it is refused
before anything is sent, redirects are never followed (so a token goes only to its
target's host), and the lean transport connects only to addresses the allowlist accepts
for that name (a name that resolves to a metadata address is refused at connect time).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx

from planner.errors import NotPrometheusText, OutboundRefused, TargetAuthError, TargetError
from probes.vllm.metrics import ParsedScrape, parse_metrics
from probes.vllm.transport import RESOLVE, LeanTransport
from storage.outbound import LOOPBACK_ONLY, Allowlist, check_token_env
from storage.schemas import ScrapeLimits, normalize_base_url

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
T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """Where an engine answers, the bearer token it wants (never printed), and where
    requests may go (loopback only, unless the caller hands the store's allowlist)."""

    base_url: str
    token: str | None = field(default=None, repr=False)
    allow: Allowlist = field(default=LOOPBACK_ONLY, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))

    @classmethod
    def resolve(
        cls,
        base_url: str,
        token_env: str | None,
        environ: Mapping[str, str] | None = None,
        allow: Allowlist = LOOPBACK_ONLY,
    ) -> Target:
        """A target whose token is read now from the named variable: only a KVSCOPE_TOKEN_
        one (so no other secret of the environment can be named), and unset is an error."""
        if not token_env:
            return cls(base_url, allow=allow)
        check_token_env(token_env)
        token = (os.environ if environ is None else environ).get(token_env)
        if not token:
            raise TargetError(
                f"the target needs a bearer token from ${token_env}, but that variable is not "
                "set in this process' environment"
            )
        return cls(base_url, token, allow)

    def check(self, url: str) -> None:
        """OutboundRefused unless `url` is on the target's own host and that host is
        allowed: nothing is sent, so a refusal says nothing of what is there."""
        host = httpx.URL(url).host
        if host != httpx.URL(self.base_url).host:
            raise OutboundRefused(f"{url} is not on the target's host; nothing was sent")
        self.allow.check(host)

    @property
    def extensions(self) -> dict[str, Any]:
        """What each request carries for the lean transport: how to resolve its host
        within the allowlist."""
        return {RESOLVE: resolver(self.allow)}

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
    merged into every body (temperature, ...); `headers` carry the target's token and
    `extensions` its allowlist (`Target.extensions`).
    """

    base_url: str
    model: str
    api: Api = "completions"
    ignore_eos: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    extensions: Mapping[str, Any] = field(default_factory=dict, repr=False)

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


def resolver(allow: Allowlist) -> Callable[[str, int], Awaitable[list[str]]]:
    """The lookup the lean transport connects with: every address a name resolves to must
    pass the allowlist (one refused address refuses the name: it is not to be trusted),
    and the transport connects to those addresses, never to a second lookup's."""

    async def resolve(host: str, port: int) -> list[str]:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in addresses:
            allow.check_address(host, address)
        return addresses

    return resolve


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


def status_error(resp: httpx.Response, url: str, detail: str = "") -> TargetError:
    """A TargetError for an HTTP error status; 401 and 403 say what to do about the token,
    a redirect names where it points (kvscope never follows one)."""
    status = resp.status_code
    if status == 401:
        return TargetAuthError(
            f"{url}: 401: the engine wants a token (set the target's token variable, "
            "e.g. --token-env, to the key the engine was started with)"
        )
    if status == 403:
        return TargetAuthError(f"{url}: 403: the engine refused the token; check its value")
    if 300 <= status < 400:
        where = resp.headers.get("location", "")[:200]
        return TargetError(
            f"{url} redirected (HTTP {status}) to {where!r}; kvscope does not follow "
            "redirects: give the final URL"
        )
    tail = f": {detail[:300]}" if detail else ""
    return TargetError(f"{url} answered HTTP {status}{tail}")


def _reason(err: BaseException) -> str:
    """The cause a person can act on, from anywhere in the exception's chain."""
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for e in chain:
        text = str(e)
        if isinstance(e, ConnectionRefusedError) or "Connection refused" in text:
            return "connection refused (is the engine running on that port?)"
        if isinstance(e, socket.gaierror) or "Name or service not known" in text:
            return "unknown host name"
    return str(err) or type(err).__name__


def _models(resp: httpx.Response, url: str) -> list[str]:
    if resp.status_code != 200:
        raise status_error(resp, url)
    try:
        data = resp.json()
    except ValueError as err:
        raise TargetError(
            f"{url} did not answer JSON; is this an OpenAI-compatible server?"
        ) from err
    items = data.get("data", []) if isinstance(data, dict) else []
    return [str(m["id"]) for m in items if isinstance(m, dict) and m.get("id")]


def parse_page(
    text: str,
    url: str,
    limits: ScrapeLimits | None = None,
    cache: dict[str, list[Any]] | None = None,
) -> ParsedScrape:
    """Parse a metrics page within the limits; CPU work, so callers keep it off event loops.
    `cache` (one per target) spares parsing the families unchanged since its last page."""
    limits = limits or ScrapeLimits()
    # Lines that are neither comments nor blank: counted without splitting the page.
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    samples = lines - text.count("\n#") - text.startswith("#") - text.count("\n\n")
    if samples > limits.sample_limit:
        raise TargetError(
            f"{url} has {samples:,} samples, over the sample limit of {limits.sample_limit:,}; "
            "nothing was stored"
        )
    try:
        parsed = parse_metrics(
            text,
            label_limit=limits.label_limit,
            label_value_length_limit=limits.label_value_length_limit,
            cache=cache,
        )
    except NotPrometheusText as err:
        raise NotPrometheusText(f"{url}: {err}") from err
    except TargetError as err:  # a label over its limit
        raise TargetError(f"{url}: {err}; nothing was stored") from err
    if not parsed.samples and not parsed.cache_info:
        raise NotPrometheusText(
            f"{url} serves Prometheus text but no vLLM metrics (no 'vllm:' names); "
            "is this the engine's URL?"
        )
    return parsed


class _BodyReader:
    """A metrics body taken as raw bytes, decompressed here (never more than the limit at a
    time, so a gzip bomb costs the limit, not its inflated size) and decoded as UTF-8."""

    def __init__(self, url: str, limit: int, encoding: str | None) -> None:
        self.url, self.limit = url, limit
        self.buf = bytearray()
        enc = (encoding or "identity").strip().lower()
        if enc in ("identity", ""):
            self.inflate: zlib._Decompress | None = None
        elif enc in ("gzip", "x-gzip", "deflate"):
            self.inflate = zlib.decompressobj(wbits=47)  # gzip or zlib, by the header
        else:
            raise TargetError(f"{url} sent its page in {enc!r}, which kvscope cannot read")

    def feed(self, chunk: bytes) -> None:
        if self.inflate is None:
            self._add(chunk)
            return
        data = chunk
        while data:
            try:
                out = self.inflate.decompress(data, self.limit - len(self.buf) + 1)
            except zlib.error as err:
                raise TargetError(f"{self.url} sent a damaged compressed page ({err})") from err
            self._add(out)
            data = self.inflate.unconsumed_tail

    def _add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > self.limit:
            raise TargetError(
                f"{self.url} sent more than {_size(self.limit)} (the body size limit); "
                "nothing was stored"
            )

    def text(self) -> str:
        try:
            return self.buf.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TargetError(
                f"{self.url} sent bytes that are not UTF-8 at byte {err.start}; a metrics "
                "page is UTF-8 text"
            ) from err


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:g} MiB" if n >= 1024 * 1024 else f"{n / 1024:g} KiB"


def _timed_out(url: str, timeout: float) -> TargetError:
    return TargetError(f"{url} did not answer in full within {timeout:g} s (the timeout)")


# --- the asynchronous client: every call has one deadline for all of it --------------------


class AsyncVllmClient:
    """Everything kvscope asks an engine, each call bounded by one deadline for the whole of
    it (connect, headers and body: a server that drips or never answers ends on time)."""

    def __init__(self, target: Target, http: httpx.AsyncClient) -> None:
        self.target, self.http = target, http

    @property
    def base_url(self) -> str:
        return self.target.base_url

    def endpoint(self, model: str, api: Api = "completions") -> Endpoint:
        """Where the load generator sends completions, with the target's token; refused
        when the target's host is not allowed."""
        self.target.check(self.target.base_url)
        return Endpoint(
            self.target.base_url,
            model,
            api=api,
            headers=self.target.headers,
            extensions=self.target.extensions,
        )

    def _request(self, url: str) -> dict[str, Any]:
        """The arguments every request carries, once its URL passed the allowlist: the
        token, the allowlist for the transport, and no redirect followed (the token would
        go wherever it points)."""
        self.target.check(url)
        return {
            "headers": self.target.headers,
            "extensions": self.target.extensions,
            "follow_redirects": False,
        }

    async def metrics_text(
        self, timeout: float = CALL_TIMEOUT_S, limit: int = MAX_METRICS_BYTES
    ) -> str:
        """The metrics page, within `timeout` in all and at most `limit` bytes (decompressed)."""
        missing = "has no metrics endpoint (HTTP 404); is this a vLLM server?"
        return await self.get_text(self.target.url(METRICS), timeout, limit, "text/plain", missing)

    async def get_text(
        self,
        url: str,
        timeout: float,
        limit: int,
        accept: str,
        missing: str = "was not found (HTTP 404)",
    ) -> str:
        """A GET of `url` as text, within `timeout` in all and at most `limit` bytes
        (decompressed); HTTP 404 says `missing`."""
        req = self._request(url)
        req["headers"] = req["headers"] | {"Accept-Encoding": "gzip", "Accept": accept}
        try:
            async with asyncio.timeout(timeout):
                async with self.http.stream("GET", url, timeout=timeout, **req) as resp:
                    if resp.status_code == 404:
                        raise TargetError(f"{url} {missing}")
                    if resp.status_code >= 300:
                        raise status_error(resp, url)
                    body = _BodyReader(url, limit, resp.headers.get("content-encoding"))
                    async for chunk in resp.aiter_raw():
                        body.feed(chunk)
        except TimeoutError as err:
            raise _timed_out(url, timeout) from err
        except httpx.HTTPError as err:
            raise transport_error(err, url, timeout) from err
        return body.text()

    async def scrape(
        self, timeout: float = CALL_TIMEOUT_S, limits: ScrapeLimits | None = None
    ) -> ParsedScrape:
        """The target's metrics now, parsed off the event loop (a 50 KB body would stall it)."""
        limits = limits or ScrapeLimits()
        text = await self.metrics_text(timeout, limits.body_limit_bytes)
        return await asyncio.to_thread(parse_page, text, self.target.url(METRICS), limits)

    async def healthy(self, timeout: float = 5.0) -> bool:
        """Whether the health endpoint answers 200 within `timeout` (a host the allowlist
        refuses never does)."""
        url = self.target.url(HEALTH)
        try:
            async with asyncio.timeout(timeout):
                resp = await self.http.get(url, timeout=timeout, **self._request(url))
        except (httpx.HTTPError, TimeoutError, OutboundRefused):
            return False
        return resp.status_code == 200

    async def _get_json(self, url: str, timeout: float) -> httpx.Response:
        try:
            async with asyncio.timeout(timeout):
                resp = await self.http.get(url, timeout=timeout, **self._request(url))
                await resp.aread()
        except TimeoutError as err:
            raise _timed_out(url, timeout) from err
        except httpx.HTTPError as err:
            raise transport_error(err, url, timeout) from err
        return resp

    async def models(self, timeout: float = CALL_TIMEOUT_S) -> list[str]:
        """The model ids of the model list; its status says whether our token is good."""
        url = self.target.url(MODELS)
        return _models(await self._get_json(url, timeout), url)

    async def first_model(self) -> str:
        """The first model listed; a clear error when there is none."""
        ids = await self.models()
        if not ids:
            raise TargetError(f"{self.target.url(MODELS)} lists no model; give --model")
        return ids[0]

    async def count_tokens(self, model: str, text: str, chat: bool = False) -> int | None:
        """Tokens of `text` as the engine counts them; None when it has no tokenizer endpoint."""
        url = self.target.url(TOKENIZE)
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                resp = await self.http.post(
                    url,
                    json=tokenize_body(model, text, chat),
                    timeout=CALL_TIMEOUT_S,
                    **self._request(url),
                )
        except TimeoutError as err:
            raise _timed_out(url, CALL_TIMEOUT_S) from err
        except httpx.HTTPError as err:
            raise transport_error(err, url, CALL_TIMEOUT_S) from err
        if resp.status_code in (404, 405, 501):
            return None
        if resp.status_code != 200:
            raise status_error(resp, url, resp.text)
        try:
            return int(resp.json()["count"])
        except (ValueError, KeyError, TypeError) as err:
            raise TargetError(f"{url} answered without a token count") from err


# --- the synchronous client: the same calls, each on an event loop of its own --------------


class VllmClient:
    """The same calls for synchronous callers (the engine supervisor, the CLI, checks).

    Each call runs the asynchronous one on a short-lived event loop in the calling thread,
    so its deadline holds whatever the server does; `transport` is injectable for tests.
    """

    def __init__(self, target: Target, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.target, self.transport = target, transport

    def _run(self, call: Callable[[AsyncVllmClient], Awaitable[T]]) -> T:
        async def go() -> T:
            transport = self.transport or LeanTransport()
            async with httpx.AsyncClient(transport=transport) as http:
                return await call(AsyncVllmClient(self.target, http))

        return asyncio.run(go())

    def metrics_text(
        self, timeout: float = SCRAPE_TIMEOUT_S, limit: int = MAX_METRICS_BYTES
    ) -> str:
        """The metrics page, within `timeout` in all and at most `limit` bytes."""
        return self._run(lambda c: c.metrics_text(timeout, limit))

    def scrape(
        self, timeout: float = SCRAPE_TIMEOUT_S, limits: ScrapeLimits | None = None
    ) -> ParsedScrape:
        """Fetch and parse the target's metrics within the limits."""
        limits = limits or ScrapeLimits()
        text = self.metrics_text(timeout, limits.body_limit_bytes)
        return parse_page(text, self.target.url(METRICS), limits)

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether the health endpoint answers 200 within `timeout`."""
        return self._run(lambda c: c.healthy(timeout))

    def models(self, timeout: float = CALL_TIMEOUT_S) -> list[str]:
        """The model ids the model list names."""
        return self._run(lambda c: c.models(timeout))
