"""Targets page: attach, edit, check and remove the vLLM engines kvscope scrapes.

The page never talks to an engine itself: a check is a queued run the worker carries out,
and the page shows its result when it lands.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import common
from planner.errors import KvscopeError
from storage import queries
from storage.schemas import TargetRow


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
    _add_form()
    for r in rows:
        _target_panel(r)
    _check_result()


def _add_form() -> None:
    with st.form("add_target", clear_on_submit=False):
        st.subheader("Attach an engine")
        name = st.text_input("Name", placeholder="prod-llama-70b")
        base_url = st.text_input(
            "Base URL",
            placeholder="http://10.0.0.5:8000",
            help="the engine's address; /metrics is appended",
        )
        token_env = st.text_input(
            "Bearer token variable (optional)",
            placeholder="VLLM_TOKEN",
            help="name of an environment variable in the worker's "
            "environment; the token itself is never stored",
        )
        if st.form_submit_button("Add target"):
            try:
                spec = queries.parse_target(
                    {"name": name, "base_url": base_url, "token_env": token_env or None}
                )
                row = queries.add_target(common.store(), spec)
            except KvscopeError as err:
                st.error(str(err))
            else:
                _queue_check(row)
                st.success(f"Added {row.name}; the worker checks it now.")
                common.targets.clear()


def _target_panel(r: TargetRow) -> None:
    with st.expander(f"{r.name} · {r.health}"):
        if r.health_message:
            (st.error if r.health == "down" else st.warning)(common.md_text(r.health_message))
        with st.form(f"edit_{r.id}"):
            new_name = st.text_input("Name", r.name)
            new_url = st.text_input("Base URL", r.base_url)
            new_token = st.text_input("Bearer token variable", r.token_env or "")
            enabled = st.checkbox("Scrape this target", r.enabled)
            if st.form_submit_button("Save"):
                try:
                    spec = queries.parse_target(
                        {
                            "name": new_name,
                            "base_url": new_url,
                            "token_env": new_token or None,
                            "enabled": enabled,
                            "managed": r.managed,
                            "labels": r.labels,
                        }
                    )
                    queries.update_target(common.store(), r.name, spec)
                except KvscopeError as err:
                    st.error(str(err))
                else:
                    st.success("Saved.")
                    common.targets.clear()
        c1, c2 = st.columns(2)
        if c1.button("Check now", key=f"check_{r.id}"):
            _queue_check(r)
        sure = c2.checkbox("Also delete its stored history", key=f"sure_{r.id}")
        if c2.button(
            "Remove",
            key=f"remove_{r.id}",
            disabled=not sure or r.managed,
            help="managed engines are removed from the Engine page",
        ):
            try:
                queries.remove_target(common.store(), r.name)
            except KvscopeError as err:
                st.error(str(err))
            else:
                common.targets.clear()
                st.rerun()


def _queue_check(r: TargetRow) -> None:
    run = queries.request_run(common.store(), "check_target", target_id=r.id)
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
