"""The planner's shape: it imports nothing of the project, no module reaches into another's
private helpers, and the one dense/MoE layer split agrees with a layer-by-layer count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import planner
import planner.models
from planner.models import (
    edge_tensors,
    is_moe_layer,
    layer_tensors,
    load_preset,
    param_count,
    preset_names,
    stage_weight_bytes,
    weight_bytes,
)

PLANNER_DIR = Path(planner.__file__).resolve().parent
PROJECT_ROOTS = {"app", "probes", "storage", "planner", "benchmarks", "tests"}


def _imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _modules(node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""]


@pytest.mark.parametrize("path", sorted(PLANNER_DIR.rglob("*.py")), ids=lambda p: p.name)
def test_planner_imports_only_itself_from_the_project(path: Path) -> None:
    for node in _imports(path):
        for module in _modules(node):
            root = module.split(".")[0]
            assert root == "planner" or root not in PROJECT_ROOTS, f"{path}: imports {module}"


@pytest.mark.parametrize("path", sorted(PLANNER_DIR.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_imports_another_modules_private_names(path: Path) -> None:
    for node in _imports(path):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("planner"):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{path}: imports {private} from {node.module}"


def test_models_surface_resolves() -> None:
    for name in planner.models.__all__:
        assert getattr(planner.models, name) is not None, name


@pytest.mark.parametrize("name", preset_names())
def test_layer_split_matches_a_layer_by_layer_count(name: str) -> None:
    arch = load_preset(name)
    total = sum(
        t.params for i in range(arch.num_layers) for t in layer_tensors(arch, is_moe_layer(arch, i))
    )
    first, last = edge_tensors(arch)
    assert total + sum(t.params for t in (*first, *last)) == param_count(arch).total


@pytest.mark.parametrize("name", preset_names())
def test_one_stage_on_one_gpu_holds_the_whole_model(name: str) -> None:
    arch = load_preset(name)
    everything = range(arch.num_layers)
    dtype = "bfloat16" if arch.config_dtype == "float32" else arch.config_dtype
    whole = stage_weight_bytes(arch, everything, True, True, dtype, dtype, 1)
    assert whole == weight_bytes(arch, dtype, dtype)
