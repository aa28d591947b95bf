"""The GPU catalog: every figure cited, custom sizes, unknown names refused."""

from __future__ import annotations

import pytest

from planner.errors import InvalidInput, UnknownChoice
from planner.gpus import GIB, catalog, get_gpu, gpu_names

ISSUE_GPUS = {
    "a100-40gb",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "l40s",
    "l4",
    "a10g",
    "rtx-4090",
    "mi300x",
    "b200",
}


def test_catalog_covers_the_issue() -> None:
    assert set(gpu_names()) == ISSUE_GPUS


@pytest.mark.parametrize("key", sorted(ISSUE_GPUS))
def test_every_figure_is_cited(key: str) -> None:
    gpu = get_gpu(key)
    for field in ("memory_gb", "visible", "bandwidth", "bf16"):
        assert gpu.source(field).startswith(("https://", "estimate", "public", "measured")), field
    assert gpu.source("memory_gb").startswith("https://")
    assert gpu.source("bf16").startswith("https://")
    # FP8 is either cited or explained as missing.
    assert gpu.source("fp8").startswith("https://") or "no FP8" in gpu.source("fp8")
    assert (gpu.fp8_tflops is None) == ("no FP8" in gpu.source("fp8"))


@pytest.mark.parametrize("gpu", catalog(), ids=lambda g: g.key)
def test_visible_memory_is_a_little_below_the_datasheet(gpu: object) -> None:
    from planner.gpus import GPUSpec

    assert isinstance(gpu, GPUSpec)
    # Datasheet GB are often binary GiB for HBM; the driver reports 85-100 % of them.
    assert 0.85 * gpu.memory_gb * 1e9 < gpu.visible_bytes < 1.08 * gpu.memory_gb * 1e9


def test_dense_figures_are_half_the_sparse_ones() -> None:
    h100 = get_gpu("H100-SXM")
    assert h100.bf16_tflops == 989.5 and h100.fp8_tflops == 1979
    assert get_gpu("a100-40gb").fp8_tflops is None


def test_custom_gpu() -> None:
    gpu = get_gpu("custom:24")
    assert gpu.visible_bytes == 24 * GIB and gpu.visible_gib == 24
    assert get_gpu("custom:1.5GiB").visible_bytes == 3 * GIB // 2
    with pytest.raises(InvalidInput, match="custom:<GiB>"):
        get_gpu("custom:lots")
    with pytest.raises(InvalidInput, match="positive"):
        get_gpu("custom:0")


def test_unknown_gpu_lists_choices() -> None:
    with pytest.raises(UnknownChoice) as info:
        get_gpu("v100")
    assert "h100-sxm" in str(info.value) and "custom:<GiB>" in str(info.value)
