"""The outbound allowlist: what an entry may be, which hosts a URL may name, which addresses
a name may resolve to, and which variables a token may come from. Pure: no network."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from planner.errors import InvalidInput, OutboundRefused
from storage.outbound import LOOPBACK_ONLY, Allowlist, check_token_env, parse_entry
from storage.settings import Settings

NEVER = "link-local or cloud metadata"
NOT_ALLOWED = "is not an allowed host: an admin can allow it with `kvscope hosts allow"


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("vllm.corp", "vllm.corp"),
        (" VLLM.Corp. ", "vllm.corp"),
        ("*.gpu.corp", "*.gpu.corp"),
        ("10.0.0.5", "10.0.0.5"),
        ("[fd12::5]", "fd12::5"),
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("fd12::/64", "fd12::/64"),
        ("0.0.0.0/0", "0.0.0.0/0"),  # wide, but metadata inside it stays refused
    ],
)
def test_an_entry_is_a_name_an_address_or_a_network_in_one_spelling(
    typed: str, canonical: str
) -> None:
    assert parse_entry(typed).text == canonical


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("", "give a host name, an address or a network"),
        ("http://vllm.corp:8000", "not a URL"),
        ("vllm.corp:8000", "without a port"),
        ("10.0.0.1/8", "has host bits set: did you mean 10.0.0.0/8?"),
        ("10.0.0.0/33", "is not a network"),
        ("bad_name!", "is not a host name"),
        ("*.corp", "a wildcard needs a domain"),
        ("169.254.169.254", NEVER),
        ("169.254.0.0/16", NEVER),
        ("169.254.169.0/24", NEVER),
        ("fe80::1", NEVER),
        ("fd00:ec2::254", NEVER),
        ("100.100.100.200", NEVER),
        ("metadata.google.internal", "cloud metadata service"),
        ("*.google.internal", "covers metadata.google.internal"),
        ("2852039166", NEVER),  # 169.254.169.254 spelled as one number
        ("::ffff:169.254.169.254", NEVER),
    ],
)
def test_a_bad_or_forbidden_entry_is_refused_saying_why(typed: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("?", r"\?").replace("*", r"\*")):
        parse_entry(typed)


@pytest.mark.parametrize(
    "host",
    [
        "169.254.169.254",
        "169.254.1.1",
        "fe80::1",
        "fe80::1%eth0",
        "fd00:ec2::254",
        "fd20:ce::254",
        "100.100.100.200",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",
        "2852039166",
        "0xa9.0xfe.0xa9.0xfe",
        "169.254.43518",
    ],
)
def test_link_local_and_metadata_addresses_are_refused_even_when_everything_is_allowed(
    host: str,
) -> None:
    everything = Allowlist.of(["0.0.0.0/0", "::/0"])
    for allow in (LOOPBACK_ONLY, everything):
        assert NEVER in (allow.refusal(host) or "")


def test_metadata_names_are_refused_as_written() -> None:
    everything = Allowlist.of(["0.0.0.0/0"])
    for name in ("metadata.google.internal", "METADATA.google.internal.", "metadata"):
        assert "cloud metadata service" in (everything.refusal(name) or "")


def test_loopback_is_allowed_and_nothing_else_by_default() -> None:
    for host in ("127.0.0.1", "127.9.9.9", "::1", "localhost", "LOCALHOST.", "::ffff:127.0.0.1"):
        assert LOOPBACK_ONLY.refusal(host) is None, host
    for host in ("10.0.0.5", "vllm.corp", "0.0.0.0", "192.168.1.1", "example.com"):
        assert NOT_ALLOWED in (LOOPBACK_ONLY.refusal(host) or ""), host
        with pytest.raises(OutboundRefused, match=NOT_ALLOWED.replace("`", ".")):
            LOOPBACK_ONLY.check(host)


def test_names_addresses_networks_and_wildcards_allow_what_they_cover() -> None:
    allow = Allowlist.of(["vllm.corp", "10.0.0.0/8", "192.168.1.7", "*.gpu.corp", "fd12::/64"])
    for host in ("vllm.corp", "VLLM.corp.", "10.1.2.3", "192.168.1.7", "a.gpu.corp", "fd12::9"):
        assert allow.refusal(host) is None, host
    for host in ("other.corp", "11.0.0.1", "192.168.1.8", "gpu.corp", "xgpu.corp", "fd13::1"):
        assert allow.refusal(host) is not None, host
    # A name is judged as written, never looked up: a network does not allow a name.
    assert allow.refusal("inside-10-net.corp") is not None


def test_at_connect_time_a_name_may_not_resolve_to_metadata() -> None:
    allow = Allowlist.of(["vllm.corp", "10.0.0.0/8"])
    allow.check_address("vllm.corp", "10.9.9.9")
    allow.check_address("vllm.corp", "192.168.5.5")  # a name allowed as written: any address
    allow.check_address("localhost", "127.0.0.1")
    for address in ("169.254.169.254", "fe80::1", "::ffff:169.254.169.254", "100.100.100.200"):
        with pytest.raises(OutboundRefused, match="resolves to a link-local or cloud metadata"):
            allow.check_address("vllm.corp", address)
    # A name not allowed as written reaches only loopback and the allowed networks.
    allow.check_address("other.corp", "10.1.1.1")
    with pytest.raises(OutboundRefused, match=r"other\.corp is not an allowed host"):
        allow.check_address("other.corp", "192.168.5.5")


def test_token_variables_must_carry_the_prefix() -> None:
    check_token_env("KVSCOPE_TOKEN_PROD")
    names = ("HOME", "AWS_SECRET_ACCESS_KEY", "VLLM_TOKEN", "KVSCOPE_TOKEN_", "kvscope_token_x")
    for name in names:
        with pytest.raises(OutboundRefused, match="must start with KVSCOPE_TOKEN_"):
            check_token_env(name)


def test_the_setting_takes_comma_separated_entries_and_refuses_bad_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVSCOPE_ALLOWED_HOSTS", " vllm.corp, 10.0.0.0/8,,VLLM.CORP ")
    assert Settings().allowed_hosts == ("vllm.corp", "10.0.0.0/8")
    monkeypatch.setenv("KVSCOPE_ALLOWED_HOSTS", "10.0.0.0/8,169.254.169.254")
    refused = f"KVSCOPE_ALLOWED_HOSTS: 169.254.169.254 is a {NEVER}"
    with pytest.raises(ValidationError, match=re.escape(refused)):
        Settings()
    monkeypatch.delenv("KVSCOPE_ALLOWED_HOSTS")
    assert Settings().allowed_hosts == ()
