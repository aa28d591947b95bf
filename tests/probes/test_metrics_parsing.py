"""Parsing and name mapping on hand-made edge cases (captured texts: test_captures.py)."""

from __future__ import annotations

import math

import pytest

from planner.errors import NotPrometheusText
from probes.vllm.metrics import parse_metrics, summarize
from tests.support.fake_vllm import FakeVllm


def _by_series(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in parse_metrics(text).samples:
        if s.kind not in ("bucket",):
            out[s.series] = out.get(s.series, 0.0) + s.value
    return out


@pytest.mark.parametrize("style", ["v1", "v0"])
def test_both_generations_map_to_the_same_canonical_names(style: str) -> None:
    fake = FakeVllm(style=style, kv_usage=0.25, running=3, preemptions=7, generation_tokens=99)
    fake.itl.observe(0.02, 5)
    values = _by_series(fake.text())
    assert values["kv_usage"] == 0.25 and values["running"] == 3
    assert values["preemptions_total"] == 7 and values["generation_tokens_total"] == 99
    assert values["itl_count"] == 5


def test_newest_spelling_wins_when_both_are_exposed() -> None:
    text = (
        '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{engine="0"} 0.9\n'
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.4\n'
    )
    samples = [s for s in parse_metrics(text).samples if s.series == "kv_usage"]
    assert [(s.value, s.raw_name) for s in samples] == [(0.4, "vllm:kv_cache_usage_perc")]


def test_counters_with_and_without_total_and_untyped_lines() -> None:
    no_type = 'vllm:num_preemptions_total{model_name="m"} 4\n'
    typed = (
        "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total 4\n"
        "vllm:num_preemptions_created 1.7e9\n"
    )
    for text in (no_type, typed):
        parsed = parse_metrics(text)
        assert [(s.series, s.value, s.kind) for s in parsed.samples] == [
            ("preemptions_total", 4.0, "counter")
        ]


def test_cache_config_info_goes_to_the_target() -> None:
    text = (
        '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="32",'
        'cache_dtype="auto",num_gpu_blocks="512",model_name="x"} 1.0\n'
        'vllm:num_requests_running{model_name="x"} 0\n'
    )
    parsed = parse_metrics(text)
    assert parsed.cache_info["num_gpu_blocks"] == "512" and "model_name" not in parsed.cache_info
    summary = summarize(parsed)
    assert (summary["num_gpu_blocks"], summary["block_size"], summary["cache_dtype"]) == (
        512,
        32,
        "auto",
    )


def test_nan_and_inf_gauges_are_skipped_with_a_warning() -> None:
    text = (
        "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running +Inf\n"
        "vllm:num_requests_waiting 1\n"
    )
    parsed = parse_metrics(text)
    assert [s.series for s in parsed.samples] == ["waiting"]
    assert parsed.warnings == ["2 NaN/Inf value(s) skipped"]


def test_a_corrupt_family_costs_that_family_only() -> None:
    fake = FakeVllm(running=2, waiting=5)
    lines = fake.text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("vllm:num_requests_running"))
    lines[i] = 'vllm:num_requests_running{model_name="m" 2.0'  # broken label set
    parsed = parse_metrics("\n".join(lines))
    series = {s.series for s in parsed.samples}
    assert "running" not in series and "waiting" in series and "ttft_bucket" in series
    assert parsed.warnings and "1 malformed metric family skipped" in parsed.warnings[0]


def test_truncated_body_keeps_the_complete_families() -> None:
    text = FakeVllm(waiting=5).text()
    cut = text[: text.index("vllm:time_to_first_token_seconds_bucket") + 30]
    parsed = parse_metrics(cut)
    assert {"waiting", "running", "kv_usage"} <= {s.series for s in parsed.samples}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("<html><body>502 Bad Gateway</body></html>", "HTML"),
        ('{"detail": "Not Found"}', "JSON"),
        ("hello world\n", "not Prometheus metrics text"),
    ],
)
def test_bodies_that_are_not_metrics(body: str, message: str) -> None:
    with pytest.raises(NotPrometheusText, match=message):
        parse_metrics(body)


def test_summary_quantiles_since_engine_start() -> None:
    fake = FakeVllm()
    fake.ttft.observe(0.015, 90)  # bucket (0.01, 0.02]
    fake.ttft.observe(0.3, 10)  # bucket (0.25, 0.5]
    s = summarize(parse_metrics(fake.text()))
    assert s["ttft"]["count"] == 100
    assert s["ttft"]["p50"] == pytest.approx(0.01 + 0.01 * 50 / 90)
    assert s["ttft"]["p95"] == pytest.approx(0.25 + 0.25 * 5 / 10)
    assert s["ttft"]["p99"] == pytest.approx(0.25 + 0.25 * 9 / 10)
    assert s["itl"] == {"count": 0, "p50": None, "p95": None, "p99": None}
    assert not math.isnan(s["kv_usage"])
