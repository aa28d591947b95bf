"""Streamlit entry point: page navigation. Run with `kvscope console` (or `kvscope up`)."""

from __future__ import annotations

import streamlit as st

from app.views import alerts, cost, engine, live, overview, planner, probes, slos, tail, targets

st.set_page_config(page_title="kvscope", page_icon="📈", layout="wide")

pages = {
    "Monitor": [
        st.Page(overview.render, title="Overview", url_path="overview", default=True),
        st.Page(live.render, title="Live", url_path="live"),
        st.Page(tail.render, title="Tail", url_path="tail"),
        st.Page(probes.render, title="Probes", url_path="probes"),
        st.Page(alerts.render, title="Alerts", url_path="alerts"),
    ],
    "Plan": [
        st.Page(planner.render, title="Planner", url_path="planner"),
        st.Page(slos.render, title="SLOs", url_path="slos"),
        st.Page(cost.render, title="Cost", url_path="cost"),
    ],
    "Configure": [
        st.Page(engine.render, title="Engine", url_path="engine"),
        st.Page(targets.render, title="Targets", url_path="targets"),
    ],
}
st.navigation(pages).run()
