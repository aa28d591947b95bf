"""GPU sampling: readings with a GPU, a clear "no GPU" state without, never an exception.

CI has no GPU, so NVML is replaced by a small fake with the same calls pynvml makes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from probes.worker.gpu import GpuSampler

GIB = 1 << 30


class FakeNvml:
    """Two devices; any call can be made to fail with an NVML error."""

    def __init__(self, count: int = 2, fail_on: str | None = None) -> None:
        self.count = count
        self.fail_on = fail_on
        self.shutdowns = 0

    def _maybe_fail(self, call: str, code: int) -> None:
        if self.fail_on == call:
            raise pynvml.NVMLError(code)

    def nvmlInit(self) -> None:
        self._maybe_fail("init", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._maybe_fail("memory", pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(used=(h + 1) * 10 * GIB, total=80 * GIB)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=50 + h)

    def nvmlDeviceGetName(self, h: int) -> str | bytes:
        # Older pynvml releases return bytes; both must come out as str.
        return b"NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA H100 80GB HBM3"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml()
    for name in dir(nvml):
        if name.startswith("nvml"):
            monkeypatch.setattr(pynvml, name, getattr(nvml, name))
    return nvml


def test_readings_per_device(fake: FakeNvml) -> None:
    sampler = GpuSampler()
    state = sampler.state()
    assert state["available"] is True
    assert state["message"] == "2 GPU(s) found"
    assert state["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_used_bytes": 10 * GIB,
            "memory_total_bytes": 80 * GIB,
            "utilization_pct": 50.0,
        },
        {
            "index": 1,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_used_bytes": 20 * GIB,
            "memory_total_bytes": 80 * GIB,
            "utilization_pct": 51.0,
        },
    ]
    sampler.close()
    assert fake.shutdowns == 1


def test_no_driver_is_a_state_not_a_crash(fake: FakeNvml) -> None:
    fake.fail_on = "init"
    sampler = GpuSampler()
    assert sampler.state() == {
        "available": False,
        "message": "no GPU: NVML unavailable (Driver Not Loaded)",
        "gpus": [],
    }
    sampler.close()
    assert fake.shutdowns == 0  # nothing was initialised, nothing to release


def test_driver_without_devices(fake: FakeNvml) -> None:
    fake.count = 0
    state = GpuSampler().state()
    assert state["available"] is False
    assert state["message"] == "no GPU: NVML found no devices"


def test_gpu_lost_mid_way_returns_nothing_and_says_why(fake: FakeNvml) -> None:
    sampler = GpuSampler()
    fake.fail_on = "memory"
    state = sampler.state()
    assert state["available"] is False and state["gpus"] == []
    assert state["message"] == "GPU sampling failed: GPU is lost"


def test_recovery_clears_the_failure_message(fake: FakeNvml) -> None:
    sampler = GpuSampler()
    fake.fail_on = "memory"
    sampler.state()
    fake.fail_on = None
    state = sampler.state()
    assert state["available"] is True and len(state["gpus"]) == 2
    assert state["message"] == "2 GPU(s) found"
