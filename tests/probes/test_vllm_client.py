"""The one vLLM client: paths, tokens, limits and the messages its failures carry.

httpx.MockTransport for the failure cases (no network); the loopback OpenAI stand-in for a
token-protected engine.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from planner.errors import NotPrometheusText, TargetAuthError, TargetError
from probes.vllm.client import AsyncVllmClient, Target, VllmClient
from storage.outbound import Allowlist
from tests.support.fake_openai import FakeConfig, serve

GOOD = 'vllm:num_requests_running{model_name="m"} 2.0\n'
# The stand-in hosts of the MockTransport cases, allowed as an admin would allow them.
MOCK_HOSTS = Allowlist.of(["e", "engine"])
ROOT = Path(__file__).resolve().parents[2]


def _client(
    handler: httpx.MockTransport, url: str = "http://e", token: str | None = None
) -> VllmClient:
    return VllmClient(Target(url, token, MOCK_HOSTS), handler)


class _Body(httpx.AsyncByteStream):
    """A body streamed as a server sends it (an in-memory `content=` is read at once)."""

    def __init__(self, data: bytes, chunk: int = 65536) -> None:
        self.data, self.chunk = data, chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self.data), self.chunk):
            yield self.data[i : i + self.chunk]


def _response(status: int, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers=headers, stream=_Body(body))


def _answer(status: int = 200, body: str = GOOD, ctype: str = "text/plain") -> httpx.MockTransport:
    return httpx.MockTransport(
        lambda req: _response(status, body.encode(), {"Content-Type": ctype})
    )


def test_good_scrape_and_metrics_url_is_appended() -> None:
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(str(req.url))
        return _response(200, GOOD.encode())

    parsed = _client(httpx.MockTransport(handler), "http://engine:8000/").scrape()
    assert seen == ["http://engine:8000/metrics"]
    assert parsed.samples[0].series == "running" and parsed.model_name == "m"


@pytest.mark.parametrize(
    ("status", "error", "message"),
    [
        (404, TargetError, "has no metrics endpoint"),
        (401, TargetAuthError, "401: the engine wants a token"),
        (403, TargetAuthError, "403: the engine refused the token"),
        (503, TargetError, "answered HTTP 503"),
    ],
)
def test_http_errors(status: int, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        _client(_answer(status)).scrape()


def test_html_page_is_refused_clearly() -> None:
    with pytest.raises(NotPrometheusText, match="HTML/XML page"):
        _client(_answer(body="<!doctype html><html>login</html>")).scrape()


def test_prometheus_text_without_vllm_metrics() -> None:
    body = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.5\n"
    with pytest.raises(NotPrometheusText, match="no vLLM metrics"):
        _client(_answer(body=body)).scrape()


def test_timeout_and_connection_refused() -> None:
    def slow(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=req)

    with pytest.raises(TargetError, match=r"did not answer within 1\.5 s"):
        _client(httpx.MockTransport(slow)).scrape(timeout=1.5)

    def refused(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=req)

    with pytest.raises(TargetError, match="connection refused"):
        _client(httpx.MockTransport(refused)).scrape()


def test_a_body_over_the_limit_is_refused_without_keeping_it() -> None:
    big = httpx.MockTransport(lambda req: _response(200, b"x" * (2 << 20)))
    with pytest.raises(TargetError, match="sent more than 1 MiB"):
        _client(big).metrics_text(limit=1 << 20)


def test_bearer_token_comes_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.headers.get("Authorization"))
        return _response(200, GOOD.encode())

    monkeypatch.setenv("KVSCOPE_TOKEN_VLLM", "s3cret")
    target = Target.resolve("http://e", "KVSCOPE_TOKEN_VLLM", allow=MOCK_HOSTS)
    VllmClient(target, httpx.MockTransport(handler)).scrape()
    assert seen == ["Bearer s3cret"]
    assert "s3cret" not in repr(target)  # never printed
    with pytest.raises(TargetError, match=r"\$KVSCOPE_TOKEN_NOPE, but that variable is not set"):
        Target.resolve("http://e", "KVSCOPE_TOKEN_NOPE", environ={})


def test_every_call_carries_the_token_to_a_protected_engine() -> None:
    async def calls(target: Target, url: str) -> tuple[list[str], int | None, bool, str]:
        async with httpx.AsyncClient() as http:
            vllm = AsyncVllmClient(target, http)
            models = await vllm.models()
            count = await vllm.count_tokens(models[0], "hello there")
            healthy = await vllm.healthy()
            text = await vllm.metrics_text()
        return models, count, healthy, text

    with serve(FakeConfig(api_key="k3y", metrics=True)) as fake:
        models, count, healthy, text = asyncio.run(calls(Target(fake.url, "k3y"), fake.url))
        assert models == ["tiny-llama"] and count == 3 and healthy and "vllm:" in text
        assert fake.unauthorized == 0
        with pytest.raises(TargetAuthError, match="401: the engine wants a token"):
            asyncio.run(calls(Target(fake.url), fake.url))
        assert fake.unauthorized == 1


def test_a_server_without_a_token_counter_says_so_with_none() -> None:
    async def count(url: str) -> int | None:
        async with httpx.AsyncClient() as http:
            return await AsyncVllmClient(Target(url), http).count_tokens("m", "a b c")

    with serve(FakeConfig(tokenize_endpoint=False)) as fake:
        assert asyncio.run(count(fake.url)) is None


def test_exactly_one_module_of_probes_speaks_each_engine_path() -> None:
    paths = ("/metrics", "/health", "/v1/models", "/tokenize", "/v1/completions")
    for path in paths:
        holders = sorted(
            str(p.relative_to(ROOT))
            for p in (ROOT / "probes").rglob("*.py")
            if re.search(re.escape(path) + r"\b", p.read_text())
        )
        assert holders == ["probes/vllm/client.py"], (path, holders)
