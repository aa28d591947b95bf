"""The tree is the architecture: docs/architecture.md's rooms table names every package and
what each holds, and imports point inward as the table says."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("planner", "storage", "probes", "app")
DOC = (ROOT / "docs" / "architecture.md").read_text()


def _packages() -> set[str]:
    out = set()
    for top in TOP:
        for init in (ROOT / top).rglob("__init__.py"):
            out.add(".".join(init.parent.relative_to(ROOT).parts))
    return out


def _rooms() -> dict[str, str]:
    """Package -> what the table says it holds."""
    section = DOC.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("package", "---"):
            continue
        for name in re.findall(r"`([a-z_.]+)`", cells[0]):
            rows[name] = cells[1]
    return rows


def test_the_rooms_table_names_every_package_and_no_other() -> None:
    assert set(_rooms()) == _packages()


def test_what_each_room_holds_is_there() -> None:
    for package, holds in _rooms().items():
        folder = ROOT.joinpath(*package.split("."))
        for name in re.findall(r"`([a-z_]+)(?:\.py)?`", holds):
            assert (folder / f"{name}.py").exists() or (folder / name).is_dir(), (package, name)


def _modules(top: str) -> list[Path]:
    return [p for p in (ROOT / top).rglob("*.py") if "venv" not in p.parts[:-1]]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("top", "allowed"),
    [("planner", {"planner"}), ("storage", {"planner", "storage"}), ("probes", set(TOP) - {"app"})],
)
def test_imports_point_inward(top: str, allowed: set[str]) -> None:
    for path in _modules(top):
        project = {m.split(".")[0] for m in _imports(path)} & set(TOP)
        assert project <= allowed, (str(path.relative_to(ROOT)), project - allowed)


def test_only_the_console_imports_streamlit() -> None:
    for top in ("planner", "storage", "probes"):
        for path in _modules(top):
            assert not any(m.split(".")[0] == "streamlit" for m in _imports(path)), path


def test_no_module_but_init_lies_directly_in_probes() -> None:
    assert sorted(p.name for p in (ROOT / "probes").glob("*.py")) == ["__init__.py"]


# Writes that change what a team shares: the console and the CLI make them only through the
# guarded actions (role checked, audited), never by calling the query directly.
GUARDED_WRITES = {
    "request_run",
    "cancel_run",
    "add_schedule",
    "remove_schedule",
    "save_profile",
    "save_slo",
    "remove_slo",
    "save_rule",
    "remove_rule",
    "restore_rules",
    "acknowledge_alert",
    "save_cost_frame",
    "add_target",
    "update_target",
    "remove_target",
    "allow_host",
    "remove_allowed_host",
    "save_engine_spec",
    "set_desired_state",
    "mark_started",
}


def test_the_console_and_cli_change_shared_state_only_through_guarded_actions() -> None:
    for path in _modules("app"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("q", "queries")
            ):
                assert node.attr not in GUARDED_WRITES, (str(path.relative_to(ROOT)), node.attr)
