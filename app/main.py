"""Streamlit entry point: page navigation. Run with `kvscope console` (or `kvscope up`).

Every page renders through `common.error_boundary`, the console's one place that turns an
exception into what a user sees.
"""

from __future__ import annotations

import streamlit as st

from app.common import error_boundary
from app.views import alerts, cost, engine, live, overview, planner, probes, slos, tail, targets

st.set_page_config(page_title="kvscope", page_icon="📈", layout="wide")

pages = {
    "Monitor": [
        st.Page(
            error_boundary(overview.render), title="Overview", url_path="overview", default=True
        ),
        st.Page(error_boundary(live.render), title="Live", url_path="live"),
        st.Page(error_boundary(tail.render), title="Tail", url_path="tail"),
        st.Page(error_boundary(probes.render), title="Probes", url_path="probes"),
        st.Page(error_boundary(alerts.render), title="Alerts", url_path="alerts"),
    ],
    "Plan": [
        st.Page(error_boundary(planner.render), title="Planner", url_path="planner"),
        st.Page(error_boundary(slos.render), title="SLOs", url_path="slos"),
        st.Page(error_boundary(cost.render), title="Cost", url_path="cost"),
    ],
    "Configure": [
        st.Page(error_boundary(engine.render), title="Engine", url_path="engine"),
        st.Page(error_boundary(targets.render), title="Targets", url_path="targets"),
    ],
}
st.navigation(pages).run()
