"""Targets page: attach, edit, check and remove the vLLM engines kvscope scrapes, and the
hosts they may point at.

The page never talks to an engine itself: a check is a queued run the worker carries out,
and the page shows its result when it lands. Every change is a guarded action
(`storage.access.targets`): admins attach, edit, remove and allow hosts, operators check,
everyone reads.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import common
from planner.errors import KvscopeError
from storage.access import Action, allowed
from storage.access import targets as access
from storage.outbound import REFUSED_NETWORKS
from storage.schemas import TargetRow, parse_labels


def render() -> None:
    """Draw the page."""
    st.title("Targets")
    common.worker_banner()
    url = common.db_url()
    rows = common.targets(url)
    if rows:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "name": r.name,
                        "URL": r.base_url,
                        "health": r.health,
                        "managed": r.managed,
                        "enabled": r.enabled,
                        "model": r.model_name,
                        "KV blocks": r.num_gpu_blocks,
                        "block size": r.block_size,
                        "KV dtype": r.cache_dtype,
                        "last scrape": common.age(r.last_scrape_at),
                        "message": r.health_message or "",
                    }
                    for r in rows
                ]
            ),
            hide_index=True,
            width="stretch",
        )
    if allowed(common.actor(), Action.TARGET_ADD):
        _add_form()
    for r in rows:
        _target_panel(r)
    _check_result()
    _allowed_hosts()


def _add_form() -> None:
    with st.form("add_target", clear_on_submit=False):
        st.subheader("Attach an engine")
        name = st.text_input("Name", placeholder="prod-llama-70b", key="add_name")
        base_url = st.text_input(
            "Base URL",
            placeholder="http://10.0.0.5:8000",
            help="the engine's address; /metrics is appended; its host must be allowed (below)",
            key="add_url",
        )
        token_env = st.text_input(
            "Bearer token variable (optional)",
            placeholder="KVSCOPE_TOKEN_PROD",
            help="name of an environment variable in the worker's environment, starting "
            "KVSCOPE_TOKEN_; the token itself is never stored",
            key="add_token",
        )
        labels = st.text_input(
            "Labels (optional)",
            placeholder="model=llama-70b, pool=chat, region=eu",
            help="name=value pairs, comma-separated: the Overview groups and the Fleet page "
            "filters by them; alert rules may apply per label",
            key="add_labels",
        )
        if st.form_submit_button("Add target"):
            try:
                row = access.add_target(
                    common.store(),
                    common.actor(),
                    {
                        "name": name,
                        "base_url": base_url,
                        "token_env": token_env or None,
                        "labels": parse_labels(labels),
                    },
                    common.settings().allowed_hosts,
                )
            except KvscopeError as err:
                st.error(str(err))
            else:
                _queue_check(row)
                st.success(f"Added {row.name}; the worker checks it now.")
                common.targets.clear()


def _target_panel(r: TargetRow) -> None:
    actor = common.actor()
    with st.expander(f"{r.name} · {r.health}"):
        if r.health_message:
            (st.error if r.health == "down" else st.warning)(common.md_text(r.health_message))
        if allowed(actor, Action.TARGET_UPDATE):
            _edit_form(r)
        c1, c2 = st.columns(2)
        if allowed(actor, Action.TARGET_CHECK) and c1.button("Check now", key=f"check_{r.id}"):
            _queue_check(r)
        if not allowed(actor, Action.TARGET_REMOVE):
            return
        sure = c2.checkbox("Also delete its stored history", key=f"sure_{r.id}")
        if c2.button(
            "Remove",
            key=f"remove_{r.id}",
            disabled=not sure or r.managed,
            help="managed engines are removed from the Engine page",
        ):
            try:
                access.remove_target(common.store(), actor, r.name)
            except KvscopeError as err:
                st.error(str(err))
            else:
                common.targets.clear()
                st.rerun()


def _edit_form(r: TargetRow) -> None:
    with st.form(f"edit_{r.id}"):
        new_name = st.text_input("Name", r.name)
        new_url = st.text_input("Base URL", r.base_url)
        new_token = st.text_input("Bearer token variable", r.token_env or "")
        new_labels = st.text_input(
            "Labels", ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items()))
        )
        enabled = st.checkbox("Scrape this target", r.enabled)
        if st.form_submit_button("Save"):
            try:
                access.update_target(
                    common.store(),
                    common.actor(),
                    r.name,
                    {
                        "name": new_name,
                        "base_url": new_url,
                        "token_env": new_token or None,
                        "enabled": enabled,
                        "labels": parse_labels(new_labels),
                        "scrape": r.scrape,
                        "source": r.source,
                        "selector": r.selector,
                    },
                    common.settings().allowed_hosts,
                )
            except KvscopeError as err:
                st.error(str(err))
            else:
                st.success("Saved.")
                common.targets.clear()


def _queue_check(r: TargetRow) -> None:
    try:
        run = access.check_target(
            common.store(), common.actor(), r, common.settings().allowed_hosts
        )
    except KvscopeError as err:
        st.error(str(err))
        return
    st.session_state["check_run"] = (run.id, r.name)


@st.fragment(run_every=1.0)
@common.error_boundary
def _check_result() -> None:
    pending = st.session_state.get("check_run")
    if not pending:
        return
    run_id, name = pending
    try:
        run = common.run(common.db_url(), run_id)
    except KvscopeError as err:
        st.error(str(err))
        return
    if run.status in ("queued", "running"):
        st.info(
            f"Checking {name}… (the worker picks this up within a second; if it stays "
            "queued, no worker is running)"
        )
    elif run.status == "done":
        s = run.summary
        st.success(
            f"{name} answers as vLLM: model {common.md_text(s.get('model_name') or '?')}, KV usage "
            f"{_pct(s.get('kv_usage'))}, {s.get('num_gpu_blocks') or '?'} KV blocks of "
            f"{s.get('block_size') or '?'} tokens."
        )
    else:
        st.error(f"{name}: {common.md_text(run.error or run.status)}")


def _pct(v: object) -> str:
    return f"{v:.1%}" if isinstance(v, float) else "?"


def _allowed_hosts() -> None:
    """Where targets may point: loopback always, these entries, never link-local or metadata."""
    st.subheader("Allowed hosts")
    configured = common.settings().allowed_hosts
    rows = access.allowed_hosts(common.store(), configured)
    st.caption(
        "Targets may point at loopback and at these hosts and networks only (on any port). "
        f"Never at link-local or cloud metadata addresses ({', '.join(map(str, REFUSED_NETWORKS))} "
        "and the metadata names), even when allowed."
    )
    if rows:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "host": h.pattern,
                        "allowed by": h.added_by or "KVSCOPE_ALLOWED_HOSTS",
                        "since": common.age(h.added_at) if h.added_at else "",
                        "note": h.note or "",
                    }
                    for h in rows
                ]
            ),
            hide_index=True,
            width="stretch",
        )
    else:
        st.info("No host beyond loopback is allowed yet.")
    actor = common.actor()
    if not allowed(actor, Action.HOST_ALLOW):
        st.caption("An admin can allow a host here or with `kvscope hosts allow HOST`.")
        return
    with st.form("allow_host"):
        pattern = st.text_input(
            "Host, address or network",
            placeholder="vllm.corp, *.gpu.corp, 10.0.0.5 or 10.0.0.0/8",
            key="host_pattern",
        )
        note = st.text_input(
            "Note (optional)", placeholder="the inference cluster", key="host_note"
        )
        if st.form_submit_button("Allow"):
            try:
                row = access.allow_host(common.store(), actor, pattern, note or None, configured)
            except KvscopeError as err:
                st.error(str(err))
            else:
                st.success(f"Allowed {row.pattern}; the worker applies it within seconds.")
    removable = [h.pattern for h in rows if h.source == "table"]
    if removable:
        c1, c2 = st.columns([3, 1])
        gone = c1.selectbox("Stop allowing", removable, key="host_remove_pick")
        if c2.button("Remove host", key="host_remove"):
            try:
                access.remove_host(common.store(), actor, gone, configured)
            except KvscopeError as err:
                st.error(str(err))
            else:
                st.rerun()
