"""What the engine's own interpreter runs imports the standard library at module level and the
engine venv's packages only inside functions, so kvscope can import it and the engine can run it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

import probes.engine.venv

VENV_DIR = Path(probes.engine.venv.__file__).resolve().parent
ENGINE_PACKAGES = frozenset({"torch", "transformers", "tokenizers", "safetensors", "vllm"})
MODULES = sorted(VENV_DIR.glob("*.py"))


def _imports(nodes: Iterable[ast.AST]) -> list[tuple[str, int]]:
    """Top-level names imported by these nodes (relative imports as '.')."""
    found: list[tuple[str, int]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = "." if node.level else (node.module or "").split(".")[0]
            found.append((name, node.lineno))
    return found


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements that run at import: the body, and inside if/try/with at that level."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody", "handlers"):
                todo += getattr(node, block, [])
        elif isinstance(node, ast.ExceptHandler):
            todo += node.body
    return out


def _in_functions(tree: ast.Module) -> list[ast.AST]:
    return [
        inner
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for inner in ast.walk(fn)
    ]


def test_the_folder_holds_modules() -> None:
    assert {p.name for p in MODULES} >= {"__init__.py", "tinymodel.py", "vllm_entry.py"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_level_imports_are_standard_library(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [
        f"{path.name}:{line} imports {name}"
        for name, line in _imports(_module_level(tree))
        if name not in sys.stdlib_module_names
    ]
    assert not bad, "module level may import only the standard library: " + "; ".join(bad)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_function_imports_are_standard_library_or_the_engine_venv(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    allowed = sys.stdlib_module_names | ENGINE_PACKAGES
    bad = [
        f"{path.name}:{line} imports {name}"
        for name, line in _imports(_in_functions(tree))
        if name not in allowed
    ]
    assert not bad, "functions may import the stdlib and the engine venv's packages: " + (
        "; ".join(bad)
    )


def test_the_checker_sees_a_third_party_import_at_module_level() -> None:
    tree = ast.parse("import os\ntry:\n    import torch\nexcept ImportError:\n    pass\n")
    assert sorted(n for n, _ in _imports(_module_level(tree))) == ["os", "torch"]
