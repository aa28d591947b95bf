"""Run one console page headless (Streamlit's AppTest) and fail on any exception it raises."""

from __future__ import annotations

import streamlit as st
from streamlit.testing.v1 import AppTest


def run_page(name: str) -> AppTest:
    """The page `app.views.<name>`, rendered once from what the store holds now: reads an
    earlier render cached (for two seconds) would otherwise hide a test's own writes."""
    st.cache_data.clear()
    at = AppTest.from_string(f"from app.views import {name}\n{name}.render()", default_timeout=60)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at
