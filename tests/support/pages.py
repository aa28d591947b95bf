"""Run one console page headless (Streamlit's AppTest) and fail on any exception it raises."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def run_page(name: str) -> AppTest:
    """The page `app.views.<name>`, rendered once."""
    at = AppTest.from_string(f"from app.views import {name}\n{name}.render()", default_timeout=60)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at
