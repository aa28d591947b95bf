"""Sample local NVIDIA GPUs through NVML (pynvml), or say clearly that there are none.

A machine without a GPU or driver is a normal state, not an error: `GpuSampler.state()`
explains what NVML said, and `sample()` returns an empty list. Nothing here raises.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

import pynvml


@dataclass(frozen=True)
class GpuSample:
    """One GPU's memory and utilisation at a moment."""

    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: float

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for the store."""
        return asdict(self)


class GpuSampler:
    """Holds the NVML session; create once per worker."""

    def __init__(self) -> None:
        self.available = False
        self.message = self._found = ""
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            self.message = f"no GPU: NVML unavailable ({err})"
            return
        if count == 0:
            self.message = "no GPU: NVML found no devices"
            return
        self.available = True
        self.message = self._found = f"{count} GPU(s) found"

    def sample(self) -> list[GpuSample]:
        """Current readings; an empty list without GPUs or when NVML fails mid-way."""
        if not self.available:
            return []
        out = []
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                util = pynvml.nvmlDeviceGetUtilizationRates(h)
                name = pynvml.nvmlDeviceGetName(h)
                out.append(
                    GpuSample(
                        i,
                        name if isinstance(name, str) else name.decode(),
                        int(mem.used),
                        int(mem.total),
                        float(util.gpu),
                    )
                )
        except pynvml.NVMLError as err:
            self.message = f"GPU sampling failed: {err}"
            return []
        self.message = self._found  # a failure that passed should not linger on the page
        return out

    def state(self) -> dict[str, Any]:
        """What the console shows: availability, message and the latest readings."""
        gpus = self.sample()
        return {
            "available": self.available and bool(gpus),
            "message": self.message,
            "gpus": [g.as_dict() for g in gpus],
        }

    def close(self) -> None:
        """Release NVML."""
        if self.available:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
