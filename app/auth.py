"""Sign-in for the console: who is behind this browser session, and the sign-in page when
nobody is yet.

Three modes (storage.access.users.signin_mode): none (one person on their own machine: the
console is bound to loopback and everyone is the local admin), password (the users file),
and OIDC (Streamlit's `st.login`, configured in .streamlit/secrets.toml; roles from the
users file by e-mail). A password session lasts `KVSCOPE_SESSION_TTL_S`; the role is read
again on every run, so a removed user is signed out at their next click.
"""

from __future__ import annotations

import time

import streamlit as st

from app import common
from planner.errors import Forbidden, SignInFailed
from storage.access import Actor, Origin, Role
from storage.access import users as accounts

SESSION = "kvscope_session"
LOCAL = Actor("local", Role.ADMIN, Origin.CONSOLE)


def mode() -> accounts.SignIn:
    """How people sign in to this console."""
    return accounts.signin_mode(common.settings().users_file)


def current() -> tuple[Actor | None, str | None]:
    """The signed-in actor of this session, or None with why (expired, removed)."""
    config = common.settings()
    how = mode()
    if how == "none":
        accounts.refuse_open_console(st.get_option("server.address") or "127.0.0.1", how)
        return LOCAL, None
    if how == "oidc":
        if not st.user.get("is_logged_in", False):
            return None, None
        email = str(st.user.get("email") or "")
        if not email:
            raise Forbidden("the identity provider sent no e-mail address: ask for the email scope")
        return accounts.oidc_actor(config.users_file, email, Role(config.oidc_default_role)), None
    session = st.session_state.get(SESSION)
    if session is None:
        return None, None
    if session["expires"] <= time.time():
        st.session_state.pop(SESSION, None)
        return None, "Your session expired: sign in again."
    role = accounts.current_role(config.users_file, session["name"])
    if role is None:
        st.session_state.pop(SESSION, None)
        return None, f"The user {session['name']} no longer exists."
    return Actor(session["name"], role, Origin.CONSOLE), None


def gate() -> Actor:
    """The actor of this run; without one, the sign-in page is drawn and the run stops."""
    actor, why = current()
    if actor is not None:
        _signed_in_as(actor)
        return actor
    st.title("kvscope")
    if why:
        st.info(why)
    if mode() == "oidc":
        st.button("Sign in", type="primary", on_click=st.login)
    else:
        _password_form()
    st.stop()
    raise AssertionError("st.stop() returns only under a test harness")  # pragma: no cover


def _password_form() -> None:
    with st.form("signin"):
        name = st.text_input("User name", key="signin_name")
        password = st.text_input("Password", type="password", key="signin_password")
        if st.form_submit_button("Sign in", type="primary"):
            config = common.settings()
            try:
                actor = accounts.sign_in(
                    common.store(), config.users_file, name, password, config.signin_lockout
                )
            except SignInFailed as err:
                st.error(str(err))
            else:
                st.session_state[SESSION] = {
                    "name": actor.name,
                    "expires": time.time() + config.session_ttl_s,
                }
                st.rerun()


def _signed_in_as(actor: Actor) -> None:
    if actor is LOCAL:
        return
    with st.sidebar:
        st.caption(f"Signed in as {common.md_text(actor.name)} ({actor.role})")
        if st.button("Sign out", key="signout"):
            st.session_state.pop(SESSION, None)
            if mode() == "oidc":
                st.logout()
            st.rerun()
