"""Users, the audit export and the console's bind refusal, as a person runs them from a
shell: real processes on a temporary data directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from tests.e2e.browser import console
from tests.support.cli import kvscope
from tests.support.waiting import free_port

PASSWORD = "correct horse battery\n"


def _add(data: Path, name: str, role: str) -> subprocess.CompletedProcess[str]:
    return kvscope(
        "users", "add", name, "--role", role, "--password-stdin", env_dir=data, stdin=PASSWORD
    )


def test_users_are_added_listed_changed_and_removed(tmp_path: Path) -> None:
    res = _add(tmp_path, "ada", "admin")
    assert res.returncode == 0 and "added ada (admin, password)" in res.stdout, res.stderr
    res = kvscope(
        "users", "add", "pat@example.com", "--role", "operator", "--oidc", env_dir=tmp_path
    )
    assert res.returncode == 0, res.stderr
    res = kvscope("users", "add", "bob", "--password-stdin", env_dir=tmp_path, stdin="short\n")
    assert res.returncode == 2 and "a password needs at least 12 characters" in res.stderr
    res = _add(tmp_path, "eve", "root")
    assert res.returncode == 2 and "root" in res.stderr
    listed = kvscope("users", "list", env_dir=tmp_path).stdout.split("\n")
    assert [line.split() for line in listed if line] == [
        ["ada", "admin", "password"],
        ["pat@example.com", "operator", "oidc"],
    ]
    res = kvscope(
        "users",
        "passwd",
        "ada",
        "--password-stdin",
        env_dir=tmp_path,
        stdin="another long secret\n",
    )
    assert res.returncode == 0, res.stderr
    assert kvscope("users", "remove", "pat@example.com", env_dir=tmp_path).returncode == 0
    res = kvscope("users", "remove", "pat@example.com", env_dir=tmp_path)
    assert res.returncode == 2 and "no user named pat@example.com" in res.stderr


def test_the_audit_export_has_every_change_with_secrets_masked(tmp_path: Path) -> None:
    _add(tmp_path, "ada", "admin")
    _add(tmp_path, "ada", "admin")
    res = kvscope("audit", "export", "--jsonl", "--since", "1h", env_dir=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(r["action"], r["subject"], r["outcome"], r["origin"]) for r in rows] == [
        ("user.add", "ada", "ok", "cli"),
        ("user.add", "ada", "failed", "cli"),
    ]
    assert "correct horse" not in res.stdout
    res = kvscope("audit", "export", "--since", "yesterday", env_dir=tmp_path)
    assert res.returncode == 2 and "give a length of time such as 90s, 15m, 24h" in res.stderr


def test_the_console_refuses_other_addresses_without_sign_in(tmp_path: Path) -> None:
    environ = {"KVSCOPE_CONSOLE_HOST": "0.0.0.0", "KVSCOPE_CONSOLE_PORT": str(free_port())}
    for command in ("console", "up"):
        res = kvscope(command, env_dir=tmp_path, environ=environ)
        assert res.returncode == 2, res.stderr
        assert "refusing to serve the console on 0.0.0.0 without sign-in" in res.stderr
    _add(tmp_path, "ada", "admin")
    with console(tmp_path, {"KVSCOPE_CONSOLE_HOST": "0.0.0.0"}) as url:  # it starts now
        assert httpx.get(f"{url}/_stcore/health", timeout=5).is_success
