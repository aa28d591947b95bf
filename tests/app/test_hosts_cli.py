"""`kvscope target add` and `kvscope hosts allow|list|remove` as a user meets them: every
outbound case refused with its reason in one line (exit 2), nothing stored, nothing
contacted. In-process through `app.cli.main()`, the CLI's one error boundary."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest
from sqlalchemy import Engine

import app.cli
from storage import queries as q
from storage.access import entries

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(store: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """`cli("target", "add", ...)` -> (exit code, stdout, stderr) on the test's store."""

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["kvscope", *args])
        with pytest.raises(SystemExit) as done:
            app.cli.main()
        out = capsys.readouterr()
        return int(done.value.code or 0), out.out, out.err

    return run


def _refused(result: tuple[int, str, str], *words: str) -> None:
    code, out, err = result
    assert code == 2 and out == "", result
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_each_outbound_case_is_refused_with_its_reason(cli: Cli, store: Engine) -> None:
    hint = "an admin can allow it with `kvscope hosts allow"
    _refused(cli("target", "add", "meta", "http://169.254.169.254"), "cloud metadata address")
    _refused(cli("target", "add", "ll", "http://169.254.7.7:8000"), "link-local")
    _refused(cli("target", "add", "ll6", "http://[fe80::1]:8000"), "link-local")
    _refused(cli("target", "add", "gce", "http://metadata.google.internal"), "metadata service")
    _refused(cli("target", "add", "far", "http://10.1.2.3:8000"), "10.1.2.3 is not an", hint)
    _refused(
        cli("target", "add", "leak", "http://127.0.0.1:9", "--token-env", "HOME"),
        "token variable HOME must start with KVSCOPE_TOKEN_",
    )
    assert q.list_targets(store) == []
    assert {(e.action, e.outcome) for e in entries(store)} == {("target.add", "failed")}


def test_a_host_is_allowed_listed_and_removed(cli: Cli, store: Engine) -> None:
    assert cli("hosts", "allow", "10.1.2.3", "--note", "gpu box")[1] == "allowed 10.1.2.3\n"
    assert cli("target", "add", "far", "http://10.1.2.3:8000")[0] == 0
    _refused(cli("hosts", "allow", "10.1.2.3"), "10.1.2.3 is already allowed")
    # A network: every address in it.
    assert cli("hosts", "allow", "10.20.0.0/16")[0] == 0
    assert cli("target", "add", "net", "http://10.20.9.9:8000")[0] == 0
    _refused(cli("hosts", "allow", "10.20.0.1/16"), "has host bits set: did you mean 10.20.0.0/16")
    # Metadata stays refused, whatever is allowed.
    _refused(cli("hosts", "allow", "169.254.169.254"), "never contacts those, even when allowed")
    _refused(cli("hosts", "allow", "http://x.corp"), "not a URL")
    assert cli("hosts", "allow", "0.0.0.0/0")[0] == 0
    _refused(cli("target", "add", "meta", "http://169.254.169.254"), "cloud metadata address")

    code, out, _ = cli("hosts", "list")
    assert code == 0
    assert out.splitlines()[1].split()[:2] == ["10.1.2.3", "by"]
    assert "gpu box" in out and "never: 169.254.0.0/16" in out
    listed = json.loads(cli("hosts", "list", "--json")[1])
    assert [h["pattern"] for h in listed] == ["10.1.2.3", "10.20.0.0/16", "0.0.0.0/0"]

    assert cli("hosts", "remove", "0.0.0.0/0")[0] == 0
    assert cli("hosts", "remove", "10.1.2.3")[1] == "removed 10.1.2.3\n"
    _refused(cli("hosts", "remove", "10.1.2.3"), "allowed: 10.20.0.0/16")
    _refused(cli("target", "add", "again", "http://10.1.2.3:9000"), "10.1.2.3 is not an allowed")
    assert [t.name for t in q.list_targets(store)] == ["far", "net"]


def test_the_setting_allows_a_host_that_cannot_be_removed_here(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_ALLOWED_HOSTS", "vllm.corp,10.30.0.0/16")
    assert cli("target", "add", "named", "http://vllm.corp:8000")[0] == 0
    assert cli("target", "add", "cidr", "http://10.30.1.1:8000")[0] == 0
    _refused(cli("hosts", "remove", "vllm.corp"), "allowed by KVSCOPE_ALLOWED_HOSTS")
    assert "KVSCOPE_ALLOWED_HOSTS" in cli("hosts", "list")[1]
    monkeypatch.setenv("KVSCOPE_ALLOWED_HOSTS", "169.254.169.254")
    _refused(cli("hosts", "list"), "settings refused", "KVSCOPE_ALLOWED_HOSTS: 169.254.169.254")
