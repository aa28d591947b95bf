"""Local users: a JSON file of names, roles and argon2 password hashes (or none, for people
who sign in through OIDC and need a role), sign-in with a lockout after repeated failures.

The file lives in the data directory, readable by the worker's user only. It is read on each
console run, so removing a user or changing a role takes effect at that person's next click.
Failed sign-ins are counted in the store (`signin_failures`), so a lockout holds across
console restarts; every sign-in, accepted or refused, lands in the audit log.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Engine, delete, select

from planner.errors import Forbidden, InvalidInput, NotFound, SignInFailed, validation_message
from storage.access.audit import guarded, record
from storage.access.roles import Action, Actor, Origin, Role
from storage.db import transaction
from storage.schemas import Lockout
from storage.tables import SigninFailure

# A user name is a login or an e-mail address (OIDC users are matched by their e-mail).
USER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")
MIN_PASSWORD = 12
WRONG = "wrong user name or password"

_hasher = PasswordHasher()
# Verified against when the name is unknown, so a wrong name costs as long as a wrong password.
_DUMMY = _hasher.hash("kvscope: not a password of anyone")


class User(BaseModel):
    """One person: a role, and a password hash unless they sign in through OIDC."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    role: Role
    password_hash: str | None = None
    created_at: float = Field(default_factory=time.time)

    @property
    def kind(self) -> str:
        return "password" if self.password_hash else "oidc"


class UsersFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    users: list[User] = []


def load_users(path: Path) -> dict[str, User]:
    """The users in `path` by name; no file means no users (sign-in off on loopback)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise InvalidInput(f"cannot read the users file {path} ({err.strerror})") from err
    try:
        parsed = UsersFile.model_validate(json.loads(text))
    except json.JSONDecodeError as err:
        raise InvalidInput(
            f"the users file {path} is not JSON ({err.msg}, line {err.lineno})"
        ) from err
    except ValidationError as err:
        raise InvalidInput(
            f"the users file {path} is not valid: {validation_message(err)}"
        ) from err
    return {u.name: u for u in parsed.users}


def _save(path: Path, users: dict[str, User]) -> None:
    """Write the file atomically, readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            UsersFile(users=sorted(users.values(), key=lambda u: u.name)).model_dump_json(indent=2)
        )
    os.replace(tmp, path)


def _check_name(name: str) -> None:
    if not USER_RE.match(name):
        raise InvalidInput(
            f"user name {name!r} must be 1 to 200 letters, digits or '._@+-', "
            "starting with a letter or digit"
        )


def _hash(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"a password needs at least {MIN_PASSWORD} characters")
    return _hasher.hash(password)


def add_user(
    store: Engine, actor: Actor, path: Path, name: str, role: Role, password: str | None
) -> User:
    """Add a user; `password` None makes an OIDC user (signs in with their e-mail)."""
    with guarded(store, actor, Action.USER_ADD, name, {"role": str(role)}):
        _check_name(name)
        users = load_users(path)
        if name in users:
            raise InvalidInput(f"user {name} exists: remove it first or change its password")
        user = User(
            name=name, role=role, password_hash=None if password is None else _hash(password)
        )
        _save(path, users | {name: user})
        return user


def remove_user(store: Engine, actor: Actor, path: Path, name: str) -> None:
    """Remove a user; a browser session of theirs ends at its next click."""
    with guarded(store, actor, Action.USER_REMOVE, name):
        users = load_users(path)
        if users.pop(name, None) is None:
            raise NotFound(f"no user named {name}")
        _save(path, users)


def set_password(store: Engine, actor: Actor, path: Path, name: str, password: str) -> None:
    """Give a user a new password (and clear a lockout of that name)."""
    with guarded(store, actor, Action.USER_PASSWORD, name):
        users = load_users(path)
        if name not in users:
            raise NotFound(f"no user named {name}")
        users[name] = users[name].model_copy(update={"password_hash": _hash(password)})
        _save(path, users)
        with transaction(store) as s:
            s.execute(delete(SigninFailure).where(SigninFailure.username == name))


def sign_in(
    store: Engine,
    path: Path,
    name: str,
    password: str,
    lockout: Lockout | None = None,
    now: float | None = None,
) -> Actor:
    """The console actor for `name` if `password` is theirs. Refused alike for an unknown
    name and a wrong password; refused without checking while the name is locked out."""
    lockout = lockout or Lockout()
    now = time.time() if now is None else now
    name = name.strip()
    anonymous = Actor(name or "?", Role.VIEWER, Origin.CONSOLE)
    with transaction(store) as s:
        failed = s.scalar(select(SigninFailure).where(SigninFailure.username == name))
        locked_until = failed.locked_until if failed else None
    if locked_until is not None and locked_until > now:
        minutes = max(1, round((locked_until - now) / 60))
        message = f"too many failed sign-ins for {name}: try again in {minutes} min"
        record(store, anonymous, Action.SIGN_IN, "refused", subject=name, message=message)
        raise SignInFailed(message)
    user = load_users(path).get(name)
    stored = user.password_hash if user and user.password_hash else _DUMMY
    try:
        ok = _hasher.verify(stored, password) and stored is not _DUMMY
    except (VerificationError, InvalidHashError):
        ok = False
    if not ok or user is None:
        _count_failure(store, name, lockout, now)
        record(store, anonymous, Action.SIGN_IN, "refused", subject=name, message=WRONG)
        raise SignInFailed(WRONG)
    with transaction(store) as s:
        s.execute(delete(SigninFailure).where(SigninFailure.username == name))
    actor = Actor(user.name, user.role, Origin.CONSOLE)
    record(store, actor, Action.SIGN_IN, "ok", subject=name)
    return actor


def _count_failure(store: Engine, name: str, lockout: Lockout, now: float) -> None:
    with transaction(store) as s:
        row = s.get(SigninFailure, name[:200])
        if row is None or now - row.first_at > lockout.window_s:
            if row is not None:
                s.delete(row)
                s.flush()
            row = SigninFailure(username=name[:200], failures=0, first_at=now)
            s.add(row)
        row.failures += 1
        if row.failures >= lockout.max_failures:
            row.locked_until = now + lockout.lock_s


def oidc_actor(path: Path, email: str, default_role: Role) -> Actor:
    """The console actor for a person the identity provider vouched for: their role from
    the users file (matched by e-mail), else `default_role`."""
    user = load_users(path).get(email)
    return Actor(email, user.role if user else default_role, Origin.CONSOLE)


def current_role(path: Path, name: str) -> Role | None:
    """A signed-in person's role now (None once they are removed)."""
    user = load_users(path).get(name)
    return None if user is None else user.role


SignIn = Literal["none", "password", "oidc"]

# Where Streamlit reads `st.secrets` (and so `st.login`'s [auth]) when the console runs from
# the checkout: the user's and the project's .streamlit/secrets.toml.
SECRETS_FILES = (
    Path.home() / ".streamlit" / "secrets.toml",
    Path(__file__).resolve().parents[2] / ".streamlit" / "secrets.toml",
)


def oidc_configured(secrets_files: Iterable[Path] | None = None) -> bool:
    """Whether Streamlit's secrets carry an [auth] section `st.login` can use."""
    for path in SECRETS_FILES if secrets_files is None else secrets_files:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise InvalidInput(f"cannot read {path}: {err}") from err
        auth = data.get("auth")
        if isinstance(auth, dict) and auth.get("redirect_uri") and auth.get("cookie_secret"):
            return True
    return False


def signin_mode(users_file: Path, secrets_files: Iterable[Path] | None = None) -> SignIn:
    """OIDC when Streamlit's secrets configure it, passwords when the users file holds a
    password, else none (one person on their own machine)."""
    if oidc_configured(secrets_files):
        return "oidc"
    if any(u.password_hash for u in load_users(users_file).values()):
        return "password"
    return "none"


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the console on this machine."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_open_console(host: str, mode: SignIn) -> None:
    """Forbidden when the console would serve other machines with nobody signing in."""
    if mode == "none" and not is_loopback(host):
        raise Forbidden(
            f"refusing to serve the console on {host} without sign-in: add a user "
            "(`kvscope users add NAME --role admin`) or configure OIDC in "
            ".streamlit/secrets.toml (docs/access.md)"
        )
