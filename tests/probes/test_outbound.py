"""The one vLLM client obeys the allowlist, so scrapes, checks and probes all do: a host off
it is never contacted (and its refusal says nothing of what is there), a name that resolves
to a metadata address is refused at connect time (DNS rebinding), redirects are never
followed (a token goes only to its target's host), and a token comes only from a
KVSCOPE_TOKEN_ variable. Only loopback is reached; names are resolved by a stand-in
`getaddrinfo`."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, update

from planner.errors import OutboundRefused, TargetError
from probes.load.generator import RequestSpec, new_client, run_open_loop
from probes.vllm.client import AsyncVllmClient, Target, VllmClient
from probes.worker.scraping import TargetScraper
from storage import queries as q
from storage.access import Actor, Origin, Role
from storage.access import targets as access
from storage.db import transaction
from storage.outbound import LOOPBACK_ONLY, Allowlist, allow_hint
from storage.settings import Settings
from storage.tables import Target as TargetTable
from tests.support.fake_vllm import FakeVllm, serve
from tests.support.recorder import recording, redirect_to

ADMIN = Actor("ada", Role.ADMIN, Origin.CLI)
GOOD = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2\n'
# Words that would tell a viewer what is behind a host: kvscope's transport messages.
DETAILS = ("connect", "refused", "answer", "timed out", "HTTP", "redirect", "8000", "22")


class _Page(httpx.AsyncByteStream):
    """A body read as a server streams it (an in-memory `text=` counts as read already)."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield GOOD.encode()


class Counting(httpx.MockTransport):
    """A transport that answers a good metrics page and counts what reached it."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        super().__init__(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return httpx.Response(200, stream=_Page())


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[list[str]]]]:
    """A stand-in DNS: `names["vllm.test"] = [["127.0.0.1"], ["169.254.169.254"]]` answers
    the first lookup with the first list, the next with the next (the last one sticks);
    every other name resolves as usual."""
    table: dict[str, list[list[str]]] = {}
    real: Callable[..., Any] = socket.getaddrinfo

    def fake(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        answers = table.get(str(host))
        if not answers:
            return real(host, port, *args, **kwargs)
        addresses = answers.pop(0) if len(answers) > 1 else answers[0]
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    yield table


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The addresses the transport opened connections to."""
    seen: list[str] = []
    real = asyncio.open_connection

    async def spy(host: Any = None, port: Any = None, **kwargs: Any) -> Any:
        seen.append(str(host))
        return await real(host, port, **kwargs)

    monkeypatch.setattr(asyncio, "open_connection", spy)
    return seen


def test_a_host_off_the_allowlist_is_never_contacted_and_its_refusal_tells_nothing() -> None:
    wire = Counting()
    messages = []
    for url in ("http://10.255.0.1:8000", "http://10.255.0.1:22", "http://vllm.corp:8000"):
        client = VllmClient(Target(url), wire)
        with pytest.raises(OutboundRefused) as refused:
            client.scrape()
        with pytest.raises(OutboundRefused):
            client.models()
        assert client.healthy() is False
        messages.append(str(refused.value))
    assert wire.urls == []
    # An open port and a closed one read the same: the refusal is no port scanner.
    assert messages[0] == messages[1] == allow_hint("10.255.0.1")
    for message in messages:
        assert "is not an allowed host" in message
        assert not [d for d in DETAILS if d in message], message
    # Allowed, the same host is asked.
    VllmClient(Target("http://10.255.0.1:8000", allow=Allowlist.of(["10.0.0.0/8"])), wire).scrape()
    assert wire.urls == ["http://10.255.0.1:8000/metrics"]


def test_a_metadata_address_is_refused_even_when_everything_is_allowed() -> None:
    wire = Counting()
    everything = Allowlist.of(["0.0.0.0/0", "::/0"])
    for url in ("http://169.254.169.254", "http://[fd00:ec2::254]", "http://2852039166"):
        with pytest.raises(OutboundRefused, match="link-local or cloud metadata"):
            VllmClient(Target(url, allow=everything), wire).scrape()
    assert wire.urls == []


def test_a_name_that_resolves_to_metadata_is_refused_at_connect_time(
    names: dict[str, list[list[str]]], connects: list[str]
) -> None:
    allow = Allowlist.of(["vllm.test", "two.test"])
    with serve(FakeVllm()) as url:
        port = url.rsplit(":", 1)[1]
        # DNS rebinding: loopback when first asked, the metadata address the next time.
        names["vllm.test"] = [["127.0.0.1"], ["169.254.169.254"]]
        client = VllmClient(Target(f"http://vllm.test:{port}", allow=allow))
        assert client.scrape().samples  # connected to the address it checked
        assert connects == ["127.0.0.1"]
        with pytest.raises(OutboundRefused, match="resolves to a link-local or cloud metadata"):
            client.scrape()
        # One refused address among good ones refuses the name.
        names["two.test"] = [["127.0.0.1", "169.254.169.254"]]
        with pytest.raises(OutboundRefused, match=r"two\.test is not an allowed host"):
            VllmClient(Target(f"http://two.test:{port}", allow=allow)).scrape()
    assert connects == ["127.0.0.1"]  # the refused lookups opened nothing


def test_a_redirect_is_never_followed_so_the_token_stays_with_its_host() -> None:
    async def every_call(target: Target, http: httpx.AsyncClient) -> list[str]:
        vllm = AsyncVllmClient(target, http)
        errors = []
        for call in (vllm.metrics_text(), vllm.models(), vllm.count_tokens("m", "hi")):
            try:
                await call
            except TargetError as err:
                errors.append(str(err))
        assert await vllm.healthy() is False
        load = await run_open_loop(
            http, vllm.endpoint("m"), [RequestSpec("hi", 4)], [0.0], keep_records=True
        )
        errors += [r.error or "" for r in load.records]
        return errors

    async def both(target: Target) -> list[str]:
        async with new_client(5.0) as lean:
            out = await every_call(target, lean)
        # Even a client told to follow redirects does not, for the vLLM client.
        async with httpx.AsyncClient(follow_redirects=True) as following:
            return out + await every_call(target, following)

    with recording() as far:
        for elsewhere in (far.url, f"http://localhost:{far.port}"):
            with recording(redirect_to(elsewhere)) as near:
                errors = asyncio.run(both(Target(near.url, "s3cret")))
                assert {token for _, _, token in near.seen} == {"Bearer s3cret"}
                assert len(near.seen) == 2 * 5  # metrics, models, tokenize, health, load
            assert all("302" in e for e in errors), errors
            assert sum("does not follow redirects" in e for e in errors) == 2 * 3
        assert far.seen == []  # neither the token nor anything else went there


def test_a_token_comes_only_from_a_kvscope_token_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setenv("KVSCOPE_TOKEN_PROD", "s3cret")
    with pytest.raises(OutboundRefused, match="token variable HOME must start with KVSCOPE_TOKEN_"):
        Target.resolve("http://127.0.0.1:9", "HOME")
    assert Target.resolve("http://127.0.0.1:9", "KVSCOPE_TOKEN_PROD").token == "s3cret"


def _stored_before_the_rules(store: Engine, name: str, url: str, token_env: str | None) -> int:
    """A target row as an older kvscope stored it: no allowlist, any token variable."""
    tid = q.add_target(store, q.parse_target({"name": name, "base_url": "http://127.0.0.1:1"})).id
    with transaction(store) as s:
        s.execute(
            update(TargetTable)
            .where(TargetTable.id == tid)
            .values(base_url=url, token_env=token_env)
        )
    return tid


def test_the_worker_refuses_stored_targets_off_the_allowlist_as_data(
    store: Engine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", "/secret/home")
    wire = Counting()
    scraper = TargetScraper(store, settings, wire)
    meta = _stored_before_the_rules(store, "meta", "http://169.254.169.254", None)
    off = _stored_before_the_rules(store, "off", "http://10.255.0.1:8000", None)
    leak = _stored_before_the_rules(store, "leak", "http://127.0.0.1:9", "HOME")
    scraper.refresh_allowlist()
    for tid in (meta, off, leak):
        scraper.scrape(tid)
    assert wire.urls == []
    got = {t.name: (t.health, t.health_message or "") for t in q.list_targets(store)}
    assert got["meta"][0] == got["off"][0] == got["leak"][0] == "down"
    assert "link-local or cloud metadata" in got["meta"][1]
    assert got["off"][1] == allow_hint("10.255.0.1")
    assert "must start with KVSCOPE_TOKEN_" in got["leak"][1]
    assert "/secret/home" not in str(got)
    downs = [e.message for e in q.events(store, 0, 2e9) if e.kind == "target_down"]
    assert len(downs) == 3 and not [d for d in DETAILS if d in downs[1]]
    with pytest.raises(OutboundRefused):  # the Targets page's check, as the worker runs it
        scraper.check(q.get_target(store, "off"))

    # Allowed: scraped at the next sync; no longer allowed: refused again, nothing sent.
    access.allow_host(store, ADMIN, "10.255.0.1")
    scraper.refresh_allowlist()
    scraper.scrape(off)
    assert q.get_target(store, "off").health == "up"
    assert wire.urls == ["http://10.255.0.1:8000/metrics"]
    access.remove_host(store, ADMIN, "10.255.0.1")
    scraper.refresh_allowlist()
    scraper.scrape(off)
    assert q.get_target(store, "off").health_message == allow_hint("10.255.0.1")
    assert len(wire.urls) == 1


def test_the_setting_allows_hosts_for_the_worker(store: Engine, settings: Settings) -> None:
    wire = Counting()
    scraper = TargetScraper(store, settings.model_copy(update={"allowed_hosts": ("vllm.corp",)}))
    scraper.transport = wire
    tid = _stored_before_the_rules(store, "named", "http://vllm.corp:8000", None)
    scraper.refresh_allowlist()
    scraper.scrape(tid)
    assert q.get_target(store, "named").health == "up"
    assert LOOPBACK_ONLY.refusal("vllm.corp") is not None  # the default stays closed
