"""The managed engine: its spec (`spec`), what a spec may hold and who may set it
(`allowlists`), process group and pid file (`process`), log follower (`logs`), crash policy
(`supervision`), the manager composing them (`manager`), and configure, start, stop and
restart as guarded actions (`changes`). May import `planner`, `storage` and `probes.vllm`.
`venv/` holds scripts the engine's own interpreter runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probes.engine.logs import LogFollower, rotate, tail_file
    from probes.engine.manager import EngineManager, EngineState
    from probes.engine.process import EngineProcess, group_pids, spec_hash
    from probes.engine.spec import (
        DTYPES,
        ENTRY,
        KV_DTYPES,
        EngineSpec,
        build_tiny_model,
        embedded_spec,
        engine_tmp_dir,
        parse_env_items,
        parse_spec,
        port_in_use,
        preflight,
    )
    from probes.engine.supervision import CrashPolicy, CrashVerdict

# Names are loaded when first used, so importing one submodule stays light.
_WHERE: dict[str, str] = {
    "CrashPolicy": "probes.engine.supervision",
    "CrashVerdict": "probes.engine.supervision",
    "DTYPES": "probes.engine.spec",
    "ENTRY": "probes.engine.spec",
    "EngineManager": "probes.engine.manager",
    "EngineProcess": "probes.engine.process",
    "EngineSpec": "probes.engine.spec",
    "EngineState": "probes.engine.manager",
    "KV_DTYPES": "probes.engine.spec",
    "LogFollower": "probes.engine.logs",
    "build_tiny_model": "probes.engine.spec",
    "embedded_spec": "probes.engine.spec",
    "engine_tmp_dir": "probes.engine.spec",
    "group_pids": "probes.engine.process",
    "parse_env_items": "probes.engine.spec",
    "parse_spec": "probes.engine.spec",
    "port_in_use": "probes.engine.spec",
    "preflight": "probes.engine.spec",
    "rotate": "probes.engine.logs",
    "spec_hash": "probes.engine.process",
    "tail_file": "probes.engine.logs",
}
__all__ = [
    "DTYPES",
    "ENTRY",
    "KV_DTYPES",
    "CrashPolicy",
    "CrashVerdict",
    "EngineManager",
    "EngineProcess",
    "EngineSpec",
    "EngineState",
    "LogFollower",
    "build_tiny_model",
    "embedded_spec",
    "engine_tmp_dir",
    "group_pids",
    "parse_env_items",
    "parse_spec",
    "port_in_use",
    "preflight",
    "rotate",
    "spec_hash",
    "tail_file",
]


def __getattr__(name: str) -> Any:
    """A public name of the package, imported from its module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
