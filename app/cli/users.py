"""`kvscope users ...`: the local users who sign in to the console, and their roles.

Run on the machine itself (the CLI acts as its owner). Passwords are asked for twice without
echo, or read from stdin with --password-stdin for scripts; the file keeps argon2 hashes.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from app.cli._shared import owner, settings, store
from storage.access import Role

users_app = typer.Typer(help="Manage who signs in to the console.", no_args_is_help=True)

PasswordStdin = Annotated[
    bool, typer.Option("--password-stdin", help="read the password from stdin (one line)")
]


def _password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    return str(typer.prompt("Password", hide_input=True, confirmation_prompt=True))


@users_app.command("add")
def users_add(
    name: Annotated[str, typer.Argument(help="login name, or e-mail address for OIDC")],
    role: Annotated[Role, typer.Option(help="viewer, operator or admin")] = Role.VIEWER,
    oidc: Annotated[
        bool, typer.Option("--oidc", help="signs in through OIDC: a role, no password")
    ] = False,
    password_stdin: PasswordStdin = False,
) -> None:
    """Add a user; with a password user, the console asks everyone to sign in."""
    from storage.access import users

    password = None if oidc else _password(password_stdin)
    user = users.add_user(store(), owner(), settings().users_file, name, role, password)
    typer.echo(f"added {user.name} ({user.role}, {user.kind})")


@users_app.command("remove")
def users_remove(name: Annotated[str, typer.Argument()]) -> None:
    """Remove a user; their browser session ends at its next click."""
    from storage.access import users

    users.remove_user(store(), owner(), settings().users_file, name)
    typer.echo(f"removed {name}")


@users_app.command("list")
def users_list() -> None:
    """List users with their role and how they sign in."""
    from storage.access import users

    for user in users.load_users(settings().users_file).values():
        typer.echo(f"{user.name:<30} {user.role:<9} {user.kind}")


@users_app.command("passwd")
def users_passwd(
    name: Annotated[str, typer.Argument()], password_stdin: PasswordStdin = False
) -> None:
    """Set a user's password (and lift a lockout of that name)."""
    from storage.access import users

    users.set_password(store(), owner(), settings().users_file, name, _password(password_stdin))
    typer.echo(f"changed the password of {name}")
