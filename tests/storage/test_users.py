"""Local users and sign-in: argon2 hashes in a private file, one answer for a wrong name and
a wrong password, a lockout after repeated failures, the sign-in mode, the bind refusal, and
a data directory and database only their owner can read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import Engine

from planner.errors import Forbidden, InvalidInput, NotFound, SignInFailed
from storage.access import Actor, Origin, Role, entries
from storage.access import users as accounts
from storage.db import open_store
from storage.schemas import Lockout
from storage.settings import Settings

OWNER = Actor("root", Role.ADMIN, Origin.CLI)
PASSWORD = "correct horse battery"
LOCK = Lockout(max_failures=3, window_s=600, lock_s=900)


@pytest.fixture
def users_file(settings: Settings, store: Engine) -> Path:
    path = settings.users_file
    accounts.add_user(store, OWNER, path, "ada", Role.ADMIN, PASSWORD)
    accounts.add_user(store, OWNER, path, "omar", Role.OPERATOR, PASSWORD + "!")
    accounts.add_user(store, OWNER, path, "pat@example.com", Role.OPERATOR, None)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_users_file_keeps_argon2_hashes_readable_by_its_owner_only(users_file: Path) -> None:
    text = users_file.read_text()
    assert PASSWORD not in text and text.count("$argon2id$") == 2
    assert _mode(users_file) == 0o600
    got = {u.name: (u.role, u.kind) for u in accounts.load_users(users_file).values()}
    assert got == {
        "ada": (Role.ADMIN, "password"),
        "omar": (Role.OPERATOR, "password"),
        "pat@example.com": (Role.OPERATOR, "oidc"),
    }


def test_bad_users_are_refused_with_the_reason(store: Engine, users_file: Path) -> None:
    with pytest.raises(InvalidInput, match="user ada exists"):
        accounts.add_user(store, OWNER, users_file, "ada", Role.VIEWER, PASSWORD)
    with pytest.raises(InvalidInput, match="at least 12 characters"):
        accounts.add_user(store, OWNER, users_file, "bob", Role.VIEWER, "short")
    with pytest.raises(InvalidInput, match="must be 1 to 200 letters"):
        accounts.add_user(store, OWNER, users_file, "bob smith", Role.VIEWER, PASSWORD)
    with pytest.raises(Forbidden, match=r"user\.add needs the admin role"):
        accounts.add_user(
            store,
            Actor("omar", Role.OPERATOR, Origin.CONSOLE),
            users_file,
            "b",
            Role.ADMIN,
            PASSWORD,
        )
    with pytest.raises(NotFound, match="no user named bob"):
        accounts.remove_user(store, OWNER, users_file, "bob")
    users_file.write_text("{not json")
    with pytest.raises(InvalidInput, match="is not JSON"):
        accounts.load_users(users_file)


def test_sign_in_gives_the_role_and_says_the_same_for_a_wrong_name(
    store: Engine, users_file: Path
) -> None:
    assert accounts.sign_in(store, users_file, "ada", PASSWORD) == Actor(
        "ada", Role.ADMIN, Origin.CONSOLE
    )
    for name, password in (
        ("ada", "wrong password!"),
        ("nobody", PASSWORD),
        ("pat@example.com", ""),
    ):
        with pytest.raises(SignInFailed, match=r"^wrong user name or password$"):
            accounts.sign_in(store, users_file, name, password)
    outcomes = [(e.subject, e.outcome) for e in reversed(entries(store)) if e.action == "sign.in"]
    assert outcomes == [
        ("ada", "ok"),
        ("ada", "refused"),
        ("nobody", "refused"),
        ("pat@example.com", "refused"),
    ]


def test_repeated_failures_lock_the_name_out_for_a_while(store: Engine, users_file: Path) -> None:
    t0 = 1_000_000.0
    for i in range(LOCK.max_failures):
        with pytest.raises(SignInFailed, match="wrong"):
            accounts.sign_in(store, users_file, "omar", "guess number " + str(i), LOCK, t0 + i)
    with pytest.raises(
        SignInFailed, match="too many failed sign-ins for omar: try again in 15 min"
    ):
        accounts.sign_in(store, users_file, "omar", PASSWORD + "!", LOCK, t0 + 10)
    # Another name is not locked; the lock ends; a success clears the count.
    assert accounts.sign_in(store, users_file, "ada", PASSWORD, LOCK, t0 + 10).role is Role.ADMIN
    later = t0 + 2 + LOCK.lock_s + 1
    assert accounts.sign_in(store, users_file, "omar", PASSWORD + "!", LOCK, later).name == "omar"
    with pytest.raises(SignInFailed, match="wrong"):
        accounts.sign_in(store, users_file, "omar", "one more guess", LOCK, later + 1)


def test_a_new_password_lifts_the_lockout(store: Engine, users_file: Path) -> None:
    for i in range(LOCK.max_failures):
        with pytest.raises(SignInFailed):
            accounts.sign_in(store, users_file, "omar", f"guess {i} xxxxxxx", LOCK)
    accounts.set_password(store, OWNER, users_file, "omar", "a brand new passphrase")
    assert (
        accounts.sign_in(store, users_file, "omar", "a brand new passphrase", LOCK).name == "omar"
    )


def test_the_sign_in_mode_and_the_console_bind_refusal(tmp_path: Path, users_file: Path) -> None:
    none = tmp_path / "nothing.toml"
    assert accounts.signin_mode(tmp_path / "absent.json", [none]) == "none"
    assert accounts.signin_mode(users_file, [none]) == "password"
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('[auth]\nredirect_uri = "http://x/oauth2callback"\ncookie_secret = "s"\n')
    assert accounts.signin_mode(tmp_path / "absent.json", [none, secrets]) == "oidc"
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        accounts.refuse_open_console(host, "none")
    for host in ("0.0.0.0", "10.1.2.3", "::", "kvscope.example.com"):
        with pytest.raises(Forbidden, match=f"refusing to serve the console on {host} without"):
            accounts.refuse_open_console(host, "none")
        accounts.refuse_open_console(host, "password")
    assert accounts.oidc_actor(users_file, "pat@example.com", Role.VIEWER).role is Role.OPERATOR
    assert accounts.oidc_actor(users_file, "eve@example.com", Role.VIEWER).role is Role.VIEWER


def test_the_data_directory_and_database_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = open_store(f"sqlite:///{data / 'kvscope.db'}")
    store.dispose()
    assert _mode(data) == 0o700 and _mode(data / "kvscope.db") == 0o600
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    os.chmod(wide, 0o755)
    Settings(data_dir=wide).private_data_dir()
    assert _mode(wide) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    Settings(data_dir=shared).private_data_dir()  # a /tmp-like folder is not ours to change
    assert _mode(shared) == 0o1777
