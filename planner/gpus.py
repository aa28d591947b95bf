"""GPU catalog: memory, HBM bandwidth and dense BF16/FP8 throughput, from data/gpus.toml.

Every figure in the data file carries its datasheet address. `visible_bytes` is what the
driver reports as total memory, the number vLLM multiplies by gpu_memory_utilization.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from planner.errors import InvalidInput, UnknownChoice

GIB = 1 << 30
MIB = 1 << 20

CUSTOM_PREFIX = "custom:"
CPU_DEVICE = "cpu"


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator model: what the datasheet says and what the driver reports."""

    key: str
    name: str
    memory_gb: float
    visible_bytes: int
    bandwidth_gbs: float | None = None
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def visible_gib(self) -> float:
        """Driver-reported total memory in GiB."""
        return self.visible_bytes / GIB

    def source(self, field: str) -> str:
        """The cited address for one figure ('' when there is none, e.g. a custom GPU)."""
        return dict(self.sources).get(field, "")


def _spec_from_row(row: dict[str, Any]) -> GPUSpec:
    if "visible_mib" in row:
        visible = int(row["visible_mib"]) * MIB
    else:
        visible = round(float(row["visible_gib"]) * GIB)
    sources = tuple(
        (k.removesuffix("_source").removesuffix("_note"), str(v))
        for k, v in row.items()
        if k.endswith(("_source", "_note"))
    )
    return GPUSpec(
        key=str(row["key"]),
        name=str(row["name"]),
        memory_gb=float(row["memory_gb"]),
        visible_bytes=visible,
        bandwidth_gbs=float(row["bandwidth_gbs"]),
        bf16_tflops=float(row["bf16_tflops"]),
        fp8_tflops=float(row["fp8_tflops"]) if "fp8_tflops" in row else None,
        sources=sources,
    )


@cache
def _catalog() -> dict[str, GPUSpec]:
    text = (Path(__file__).resolve().parent / "data" / "gpus.toml").read_text(encoding="utf-8")
    rows = tomllib.loads(text)["gpu"]
    return {spec.key: spec for spec in map(_spec_from_row, rows)}


def gpu_names() -> list[str]:
    """Catalog keys in file order (e.g. 'a100-40gb', 'h100-sxm')."""
    return list(_catalog())


def catalog() -> list[GPUSpec]:
    """Every GPU in the catalog, in file order."""
    return list(_catalog().values())


def custom_gpu(memory_gib: float, name: str | None = None) -> GPUSpec:
    """A GPU known only by its memory size in GiB (taken as the driver-visible total)."""
    if not memory_gib > 0:
        raise InvalidInput(f"custom GPU memory must be a positive number of GiB, got {memory_gib}")
    return GPUSpec(
        key=f"{CUSTOM_PREFIX}{memory_gib:g}",
        name=name or f"custom {memory_gib:g} GiB",
        memory_gb=memory_gib * GIB / 1e9,
        visible_bytes=round(memory_gib * GIB),
    )


def get_gpu(name: str) -> GPUSpec:
    """Look up a catalog GPU by key (case-insensitive) or parse 'custom:<GiB>'."""
    key = name.strip().lower()
    if key.startswith(CUSTOM_PREFIX):
        raw = key.removeprefix(CUSTOM_PREFIX).removesuffix("gib").strip()
        try:
            size = float(raw)
        except ValueError:
            raise InvalidInput(
                f"custom GPU must be written custom:<GiB>, e.g. custom:24; got {name!r}"
            ) from None
        return custom_gpu(size)
    found = _catalog().get(key)
    if found is None:
        raise UnknownChoice("GPU", name, [*gpu_names(), "custom:<GiB>", CPU_DEVICE])
    return found
