"""Every registered probe kind is complete: a CLI command, a form, a chart and its docs.

Each kind runs once, briefly, against the loopback stand-in, and its result must draw.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.charts.probes import figure
from app.cli import app
from probes.kinds import KINDS, AnyKind, execute, parse_params
from probes.vllm.client import Target
from storage.settings import Settings
from tests.probes.test_bounded_probes import _engine
from tests.support.fake_openai import FakeConfig, serve

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "probes.md").read_text()
# A quick run of each kind; a new kind adds one here (the first test says so).
QUICK: dict[str, dict[str, Any]] = {
    "latency": {"rate": 20, "duration_s": 0.5, "prompt_tokens": 16, "output_tokens": 4},
    "batch_sweep": {"concurrencies": [1, 2], "requests_per_step": 2, "prompt_tokens": 16},
    "oom": {"confirm": True, "batch": 2, "start_context": 256, "step": 512, "max_steps": 2},
    "kv_usage": {
        "rate": 10,
        "duration_s": 0.5,
        "baseline_s": 0.2,
        "cooldown_s": 0.2,
        "sample_every_s": 0.1,
        "prompt_tokens": 32,
        "prefix_tokens": 16,
        "output_tokens": 4,
    },
    "capacity": {
        "ttft_slo_s": 1.0,
        "tpot_slo_s": 0.1,
        "start_rate": 10,
        "max_rate": 20,
        "duration_s": 0.5,
        "iterations": 0,
        "prompt_tokens": 16,
        "output_tokens": 4,
    },
    "ab": {"confirm": True, "a": {"max_num_seqs": 2}, "b": {"max_num_seqs": 4}, "rate": 20,
           "duration_s": 0.5, "prompt_tokens": 16, "output_tokens": 4, "rounds": 2},
}  # fmt: skip


def test_every_kind_has_a_quick_run_here() -> None:
    assert set(QUICK) == set(KINDS)


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_every_kind_has_a_command_a_form_a_chart_and_a_section(
    kind: AnyKind, settings: Settings
) -> None:
    # CLI: the command exists and every declared option reaches its Params field.
    res = CliRunner().invoke(app, ["probe", kind.command, "--help"])
    assert res.exit_code == 0, res.output
    for opt in kind.cli:
        assert opt.field in kind.params.model_fields, (kind.name, opt.field)
        assert opt.option in res.output, (kind.name, opt.option)
    # Form: each field is a number of Params, with a default from Params or the form.
    assert kind.form, kind.name
    for f in kind.form:
        assert f.name in kind.params.model_fields, (kind.name, f.name)
    # Docs: a section named after the kind.
    assert f"\n### {kind.name}\n" in DOCS, kind.name
    # Chart, table and headline of a real (short) run.
    params = parse_params(kind.name, QUICK[kind.name])
    with serve(FakeConfig(metrics=True, max_model_len=1024)) as fake:
        extra = _engine(kind.name, settings)
        result = asyncio.run(execute(kind, params, Target(fake.url), managed=True, **extra))
    assert isinstance(result, kind.result)
    fig = figure(kind.chart(result))
    assert len(fig.data) >= 1 and fig.layout.title.text
    assert kind.headline(result)
    rows = kind.table(result)
    assert all(set(r) == set(rows[0]) for r in rows)
    # What the store keeps reads back as the same result.
    assert kind.read_result(result.model_dump()) == result
