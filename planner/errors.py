"""The one error tree of kvscope; every room raises these, pages and the CLI catch the base.

KvscopeError                 base: message is safe to show a user as is
├── InvalidInput             bad input refused at the edge (config, CLI flag, form field)
│   ├── UnknownChoice        a name that is not in a catalog (preset, GPU, dtype)
│   └── OutboundRefused      a target host off the allowlist, or a token sent elsewhere
├── NotFound                 a stored thing (target, run, spec) that does not exist
├── Forbidden                the person's role does not allow the action, or it is not
│   │                        allowed from where they are (a browser); the message says which
│   └── SignInFailed         wrong user name or password, or locked out for a while
├── TargetError              a target could not be reached or did not answer as vLLM
│   ├── TargetAuthError      the engine wants a token, or refused the one sent
│   └── NotPrometheusText    the body is not Prometheus exposition text
├── StorageError             the store failed; the message carries the driver's words
│   ├── DatabaseLocked       another process held the lock too long: retry, or stop it
│   ├── DiskFull             the disk holding the database is full: free space
│   ├── DatabaseUnavailable  cannot open or write the database: fix its path, rights, URL
│   ├── DatabaseTooNew       written by a newer kvscope: upgrade kvscope
│   └── Conflict             the change clashes with stored rows (a name taken): change it
├── LimitExceeded            a bound kvscope keeps was reached (series per target, ...)
├── Cancelled                work stopped on request (or at its deadline); what it did is kept
└── EngineError              the managed engine could not be started, stopped or found
"""

from __future__ import annotations

from collections.abc import Iterable


class KvscopeError(Exception):
    """Base of every error a user may see; ``str(err)`` is the one-line message."""


class InvalidInput(KvscopeError):
    """Input refused before anything runs."""


class UnknownChoice(InvalidInput):
    """A name that is not among the valid choices; the message lists them."""

    def __init__(self, what: str, name: str, choices: Iterable[str]) -> None:
        self.what, self.name, self.choices = what, name, sorted(choices)
        super().__init__(f"unknown {what} {name!r}; valid choices: {', '.join(self.choices)}")


class NotFound(KvscopeError):
    """A stored object that does not exist."""


class Forbidden(KvscopeError):
    """The action needs a role the person does not have, or may not be done from there."""


class SignInFailed(Forbidden):
    """A sign-in refused: wrong name or password, or the name is locked out for a while."""


class OutboundRefused(InvalidInput):
    """kvscope will not send requests (or a token) to that host."""


class TargetError(KvscopeError):
    """A target could not be reached, timed out, or answered with an error."""


class TargetAuthError(TargetError):
    """The engine answered 401 or 403: it wants a token, or not the one it was sent."""


class NotPrometheusText(TargetError):
    """The target answered, but not with Prometheus text (an HTML page, JSON, garbage)."""


class StorageError(KvscopeError):
    """The store could not be read or written (storage/db.py maps driver errors to these)."""


class DatabaseLocked(StorageError):
    """Another process held the database lock longer than the busy timeout."""


class DiskFull(StorageError):
    """The disk (or quota) holding the database has no room left."""


class DatabaseUnavailable(StorageError):
    """The database cannot be opened or written: a path, permission or connection problem."""


class DatabaseTooNew(StorageError):
    """The database's schema revision is one this kvscope does not know: a newer one wrote it."""


class Conflict(StorageError):
    """A write clashed with a constraint (a name already taken, a row since removed)."""


class LimitExceeded(KvscopeError):
    """A bound kvscope keeps on what it stores or runs was reached; the message names it."""


class Cancelled(KvscopeError):
    """Work stopped on request, or at its deadline; what it measured so far is kept."""


class EngineError(KvscopeError):
    """The managed engine could not be started, stopped or inspected."""


def validation_message(err: Exception) -> str:
    """One line out of a pydantic ValidationError: `field: message; field: message`."""
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return str(err)
    parts = []
    for e in errors():
        loc = ".".join(str(x) for x in e.get("loc", ()))
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)
