"""Audit page (admins): every state-changing action, who did it, from where, with what
parameters (secrets masked) and how it ended. The log is append-only in the database."""

from __future__ import annotations

import io
import json
import time

import pandas as pd
import streamlit as st

from app import common
from storage.access import audit, export_jsonl

LIMIT = 5000


def render() -> None:
    """Draw the page."""
    st.title("Audit log")
    store = common.store()
    window = st.selectbox("Window", list(common.WINDOWS), index=3, key="audit_window")
    since = time.time() - common.WINDOWS[window]
    rows = audit.read(store, common.actor(), since, limit=LIMIT)
    if not rows:
        st.info("Nothing was changed in this window.")
        return
    table = pd.DataFrame(
        {
            "time": [pd.Timestamp(r.ts, unit="s", tz="UTC") for r in rows],
            "actor": [r.actor for r in rows],
            "role": [r.role for r in rows],
            "origin": [r.origin for r in rows],
            "action": [r.action for r in rows],
            "subject": [r.subject or "" for r in rows],
            "outcome": [r.outcome for r in rows],
            "message": [r.message or "" for r in rows],
            "parameters": [json.dumps(r.params, sort_keys=True) if r.params else "" for r in rows],
        }
    )
    c = st.columns(3)
    who = c[0].multiselect("Actor", sorted(table["actor"].unique()), key="audit_actor")
    what = c[1].multiselect("Action", sorted(table["action"].unique()), key="audit_action")
    how = c[2].multiselect("Outcome", sorted(table["outcome"].unique()), key="audit_outcome")
    for column, chosen in (("actor", who), ("action", what), ("outcome", how)):
        if chosen:
            table = table[table[column].isin(chosen)]
    if len(rows) == LIMIT:
        st.caption(f"The newest {LIMIT} entries; `kvscope audit export --jsonl` has them all.")
    st.dataframe(table, hide_index=True, width="stretch")
    out = io.StringIO()
    export_jsonl(store, out, since)
    st.download_button(
        "Download as JSON lines",
        out.getvalue(),
        file_name="kvscope-audit.jsonl",
        mime="application/jsonl",
        key="audit_download",
    )
