"""Streamlit entry point: page navigation. Run with `kvscope console` (or `kvscope up`)."""

from __future__ import annotations

import streamlit as st

from app.views import engine, live, overview, planner, probes, tail, targets

st.set_page_config(page_title="kvscope", page_icon="📈", layout="wide")

pages = {
    "Monitor": [
        st.Page(overview.render, title="Overview", url_path="overview", default=True),
        st.Page(live.render, title="Live", url_path="live"),
        st.Page(tail.render, title="Tail", url_path="tail"),
        st.Page(probes.render, title="Probes", url_path="probes"),
    ],
    "Plan": [
        st.Page(planner.render, title="Planner", url_path="planner"),
    ],
    "Configure": [
        st.Page(engine.render, title="Engine", url_path="engine"),
        st.Page(targets.render, title="Targets", url_path="targets"),
    ],
}
st.navigation(pages).run()
