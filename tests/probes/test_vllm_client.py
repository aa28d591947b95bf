"""HTTP failures of a scrape become specific messages (httpx.MockTransport, no network)."""

from __future__ import annotations

import httpx
import pytest

from planner.errors import NotPrometheusText, TargetError
from probes.scrape import auth_headers, scrape

GOOD = 'vllm:num_requests_running{model_name="m"} 2.0\n'


def _client(handler: httpx.MockTransport) -> httpx.Client:
    return httpx.Client(transport=handler)


def _answer(status: int = 200, body: str = GOOD, ctype: str = "text/plain") -> httpx.MockTransport:
    return httpx.MockTransport(
        lambda req: httpx.Response(status, text=body, headers={"Content-Type": ctype})
    )


def test_good_scrape_and_metrics_url_is_appended() -> None:
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(str(req.url))
        return httpx.Response(200, text=GOOD)

    parsed = scrape(_client(httpx.MockTransport(handler)), "http://engine:8000/")
    assert seen == ["http://engine:8000/metrics"]
    assert parsed.samples[0].series == "running" and parsed.model_name == "m"


@pytest.mark.parametrize(
    ("status", "message"),
    [(404, "has no metrics endpoint"), (401, "refused access"), (503, "answered HTTP 503")],
)
def test_http_errors(status: int, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        scrape(_client(_answer(status)), "http://engine:8000")


def test_html_page_is_refused_clearly() -> None:
    with pytest.raises(NotPrometheusText, match="HTML/XML page"):
        scrape(_client(_answer(body="<!doctype html><html>login</html>")), "http://e")


def test_prometheus_text_without_vllm_metrics() -> None:
    body = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.5\n"
    with pytest.raises(NotPrometheusText, match="no vLLM metrics"):
        scrape(_client(_answer(body=body)), "http://e")


def test_timeout_and_connection_refused() -> None:
    def slow(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=req)

    with pytest.raises(TargetError, match=r"did not answer within 1\.5 s"):
        scrape(_client(httpx.MockTransport(slow)), "http://e", timeout=1.5)

    def refused(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=req)

    with pytest.raises(TargetError, match="connection refused"):
        scrape(_client(httpx.MockTransport(refused)), "http://e")


def test_bearer_token_comes_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.headers.get("Authorization"))
        return httpx.Response(200, text=GOOD)

    monkeypatch.setenv("MY_VLLM_TOKEN", "s3cret")
    scrape(_client(httpx.MockTransport(handler)), "http://e", token_env="MY_VLLM_TOKEN")
    assert seen == ["Bearer s3cret"]
    with pytest.raises(TargetError, match=r"\$NOPE_TOKEN, but that variable is not set"):
        auth_headers("NOPE_TOKEN", environ={})
