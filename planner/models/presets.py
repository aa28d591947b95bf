"""Built-in presets: published config.json files packaged in planner/data/models/.

Each file keeps the Hugging Face id it came from (`_hf_id`) and its source address
(`_source`), so a preset can be named either way and every figure traced back.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from planner.errors import InvalidInput, UnknownChoice
from planner.models.arch import ModelArch
from planner.models.config import from_config_dict, from_config_file

# planner/data/models (pyproject's package-data ships it), found from this file rather than
# through importlib.resources, which fails when an editable install exposes `planner` as a
# namespace package.
_PRESET_DIR = Path(__file__).resolve().parent.parent / "data" / "models"


@cache
def _preset_files() -> dict[str, str]:
    """Every preset file's text by name, read once per process."""
    return {
        entry.stem: entry.read_text(encoding="utf-8")
        for entry in sorted(_PRESET_DIR.glob("*.json"))
    }


def preset_names() -> list[str]:
    """Names of the built-in presets (e.g. 'llama-3.1-8b'), sorted."""
    return sorted(_preset_files())


def preset_config(name: str) -> dict[str, Any]:
    """The raw published config.json of a preset (with its _source key); a fresh copy."""
    files = _preset_files()
    key = _resolve_preset(name)
    data: dict[str, Any] = json.loads(files[key])
    return data


def _resolve_preset(name: str) -> str:
    """The preset key for a name or a Hugging Face id (whole, or the part after the slash)."""
    files = _preset_files()
    wanted = name.strip().lower()
    if wanted in files:
        return wanted
    for key, text in files.items():
        hf_id = str(json.loads(text).get("_hf_id", "")).lower()
        if wanted in (hf_id, hf_id.split("/")[-1]):
            return key
    raise UnknownChoice("model preset", name, [*files, "<path to config.json>"])


@cache
def load_preset(name: str) -> ModelArch:
    """Load a built-in preset by name or by its Hugging Face id (case-insensitive)."""
    key = _resolve_preset(name)
    return from_config_dict(preset_config(key), name=key)


def load_model(spec: str) -> ModelArch:
    """A preset name, a Hugging Face id of a preset, or a path to a config.json."""
    path = Path(spec).expanduser()
    if spec.endswith(".json") or path.is_dir() or path.is_file():
        if not path.exists():
            raise InvalidInput(f"no such config file: {spec}")
        return from_config_file(path)
    return load_preset(spec)
