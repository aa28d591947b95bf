"""Fetch a target's `/metrics` over HTTP and turn every failure into a message a person can act on.

The HTTP client is injected (tests hand in `httpx.MockTransport` or a loopback server).
A bearer token is read from the environment variable a target names, at call time, and
never stored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import httpx

from planner.errors import NotPrometheusText, TargetError
from probes.metrics import ParsedScrape, parse_metrics
from storage.schemas import normalize_base_url

MAX_BODY_BYTES = 16 * 1024 * 1024


def metrics_url(base_url: str) -> str:
    """The `/metrics` URL of a target base URL."""
    return normalize_base_url(base_url) + "/metrics"


def auth_headers(token_env: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Bearer header from the named environment variable; a missing variable is an error."""
    if not token_env:
        return {}
    env = os.environ if environ is None else environ
    token = env.get(token_env)
    if not token:
        raise TargetError(
            f"the target needs a bearer token from ${token_env}, but that variable is not set "
            "in the worker's environment"
        )
    return {"Authorization": f"Bearer {token}"}


def fetch_text(
    client: httpx.Client, url: str, headers: Mapping[str, str] | None = None, timeout: float = 3.0
) -> str:
    """GET `url` and return its body; raise TargetError with a specific cause otherwise."""
    try:
        resp = client.get(url, headers=dict(headers or {}), timeout=timeout)
    except httpx.TimeoutException as err:
        raise TargetError(
            f"{url} did not answer within {timeout:g} s ({type(err).__name__})"
        ) from err
    except httpx.ConnectError as err:
        raise TargetError(f"cannot connect to {url}: {_reason(err)}") from err
    except httpx.HTTPError as err:
        raise TargetError(f"request to {url} failed: {_reason(err)}") from err
    if resp.status_code in (401, 403):
        raise TargetError(f"{url} refused access (HTTP {resp.status_code}); check the token")
    if resp.status_code == 404:
        raise TargetError(f"{url} has no metrics endpoint (HTTP 404); is this a vLLM server?")
    if resp.status_code >= 400:
        raise TargetError(f"{url} answered HTTP {resp.status_code}")
    if len(resp.content) > MAX_BODY_BYTES:
        raise TargetError(f"{url} returned {len(resp.content)} bytes, over the 16 MiB limit")
    return resp.text


def scrape(
    client: httpx.Client, base_url: str, token_env: str | None = None, timeout: float = 3.0
) -> ParsedScrape:
    """Fetch and parse one target's metrics."""
    url = metrics_url(base_url)
    text = fetch_text(client, url, auth_headers(token_env), timeout)
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


def _reason(err: Exception) -> str:
    text = str(err) or type(err).__name__
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused (is the engine running on that port?)"
    if "Name or service not known" in text or "nodename nor servname" in text or "Errno -2" in text:
        return "unknown host name"
    return text
