"""The managed engine: its spec (`spec`), process group and pid file (`process`), log
follower (`logs`), crash policy (`supervision`) and the manager composing them (`manager`).
May import `planner`, `storage` and `probes.vllm`. `venv/` holds scripts the engine's own
interpreter runs.
"""

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
