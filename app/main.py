"""Streamlit entry point: sign-in, then page navigation. Run with `kvscope console` (or
`kvscope up`).

Every page renders through `common.error_boundary`, the console's one place that turns an
exception into what a user sees. `auth.gate` runs first: with sign-in on, nobody reaches a
page before signing in.
"""

from __future__ import annotations

import streamlit as st

from app import auth
from app.common import error_boundary
from app.views import (
    alerts,
    audit,
    cost,
    engine,
    fleet,
    live,
    overview,
    planner,
    probes,
    slos,
    tail,
    targets,
    whatif,
)
from storage.access import Action, allowed

st.set_page_config(page_title="kvscope", page_icon="📈", layout="wide")

actor = error_boundary(auth.gate)()
configure = [
    st.Page(error_boundary(engine.render), title="Engine", url_path="engine"),
    st.Page(error_boundary(targets.render), title="Targets", url_path="targets"),
]
if actor is not None and allowed(actor, Action.AUDIT_READ):
    configure.append(st.Page(error_boundary(audit.render), title="Audit", url_path="audit"))
pages = {
    "Monitor": [
        st.Page(
            error_boundary(overview.render), title="Overview", url_path="overview", default=True
        ),
        st.Page(error_boundary(fleet.render), title="Fleet", url_path="fleet"),
        st.Page(error_boundary(live.render), title="Live", url_path="live"),
        st.Page(error_boundary(tail.render), title="Tail", url_path="tail"),
        st.Page(error_boundary(probes.render), title="Probes", url_path="probes"),
        st.Page(error_boundary(alerts.render), title="Alerts", url_path="alerts"),
    ],
    "Plan": [
        st.Page(error_boundary(planner.render), title="Planner", url_path="planner"),
        st.Page(error_boundary(whatif.render), title="What-if", url_path="whatif"),
        st.Page(error_boundary(slos.render), title="SLOs", url_path="slos"),
        st.Page(error_boundary(cost.render), title="Cost", url_path="cost"),
    ],
    "Configure": configure,
}
if actor is None:  # the gate failed (the error is on the page): no pages
    st.stop()
st.navigation(pages).run()
