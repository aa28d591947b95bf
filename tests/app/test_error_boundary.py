"""The console's one error boundary (app/common.error_boundary) under Streamlit's AppTest.

A KvscopeError is shown as is; any other exception becomes one short line while its
traceback goes to the log; st.stop and st.rerun pass through untouched; app/main.py
renders every page through it.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import app.views.overview
from app.common import PAGE_FAILED

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"


def _kvscope_error_page() -> None:
    import streamlit as st

    from app.common import error_boundary
    from planner.errors import DatabaseLocked

    def render() -> None:
        st.title("Before the failure")
        raise DatabaseLocked("the database is locked by another process; try again")

    error_boundary(render)()


def _bug_page() -> None:
    import streamlit as st

    from app.common import error_boundary

    def render() -> None:
        st.title("Before the failure")
        raise RuntimeError("internal detail a user should not read")

    error_boundary(render)()


def _stop_page() -> None:
    import streamlit as st

    from app.common import error_boundary

    def render() -> None:
        st.markdown("drawn")
        st.stop()
        st.markdown("never drawn")

    error_boundary(render)()


def _rerun_page() -> None:
    import streamlit as st

    from app.common import error_boundary

    def render() -> None:
        runs = st.session_state.get("runs", 0) + 1
        st.session_state["runs"] = runs
        if runs < 2:
            st.rerun()
        st.markdown(f"runs: {runs}")

    error_boundary(render)()


def _fragment_page() -> None:
    import streamlit as st

    from app.common import error_boundary
    from planner.errors import NotFound

    @st.fragment(run_every=60.0)
    @error_boundary
    def panel(name: str) -> None:
        raise NotFound(f"no target named {name!r}")

    def render() -> None:
        panel("gone")
        st.markdown("below the panel")

    error_boundary(render)()


def _texts(at: AppTest) -> list[str]:
    """Everything the page wrote, as text."""
    return [
        *(m.value for m in at.markdown),
        *(e.value for e in at.error),
        *(t.value for t in at.title),
        *(x.message for x in at.exception),
    ]


def test_kvscope_error_is_shown_as_its_message() -> None:
    at = AppTest.from_function(_kvscope_error_page).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["the database is locked by another process; try again"]
    assert at.title[0].value == "Before the failure"


def test_other_exception_is_one_short_line_and_a_logged_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="app.common"):
        at = AppTest.from_function(_bug_page).run()
    assert not at.exception
    assert [e.value for e in at.error] == [PAGE_FAILED]
    assert not any("internal detail" in t or "Traceback" in t for t in _texts(at))
    [record] = [r for r in caplog.records if r.name == "app.common"]
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)


def test_st_stop_passes_through(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="app.common"):
        at = AppTest.from_function(_stop_page).run()
    assert not at.exception and not at.error
    assert [m.value for m in at.markdown] == ["drawn"]
    assert not [r for r in caplog.records if r.name == "app.common"]


def test_st_rerun_passes_through() -> None:
    at = AppTest.from_function(_rerun_page).run()
    assert not at.exception and not at.error
    assert at.session_state["runs"] == 2
    assert [m.value for m in at.markdown] == ["runs: 2"]


def test_a_live_panel_fails_alone() -> None:
    at = AppTest.from_function(_fragment_page).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["no target named 'gone'"]
    assert [m.value for m in at.markdown] == ["below the panel"]


def test_main_renders_the_default_page_through_the_boundary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken() -> None:
        raise RuntimeError("overview is broken")

    monkeypatch.setattr(app.views.overview, "render", broken)
    at = AppTest.from_file(str(MAIN), default_timeout=60).run()
    assert not at.exception
    assert [e.value for e in at.error] == [PAGE_FAILED]


def test_main_wraps_every_page() -> None:
    tree = ast.parse(MAIN.read_text())
    pages = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "st.Page"
    ]
    assert len(pages) == 13  # the Audit page among them, shown to admins
    for page in pages:
        first = page.args[0]
        assert isinstance(first, ast.Call) and ast.unparse(first.func) == "error_boundary", (
            ast.unparse(page)
        )
