"""Stored alert rules that no longer validate: one parse (`rules_from_rows`) for the Alerts
page and the export command, which set such a row aside and say so instead of failing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import Engine

from probes.alerting.rules import DEFAULT_RULES, rules_from_rows
from storage import queries as q
from tests.support.cli import kvscope
from tests.support.pages import run_page

# A kv_level threshold is a share of the cache (0 to 1): 90 is what a hand edit might write.
BAD: dict[str, Any] = {"name": "Hand-edited", "kind": "kv_level", "threshold": 90}


def test_rules_from_rows_splits_valid_from_invalid_in_stored_order() -> None:
    good = DEFAULT_RULES[1].model_dump()
    parsed = rules_from_rows([(7, good), (3, BAD), (5, DEFAULT_RULES[0].model_dump())])
    assert list(parsed.valid) == [7, 5]
    assert parsed.valid[7] == DEFAULT_RULES[1]
    assert list(parsed.invalid) == [3]
    assert parsed.invalid[3].startswith("alert rule refused:")
    assert "threshold from 0 to 1" in parsed.invalid[3]


def test_alerts_page_shows_an_invalid_rule_and_goes_on(store: Engine) -> None:
    q.ensure_rules(store, [r.model_dump() for r in DEFAULT_RULES])
    q.save_rule(store, BAD)
    at = run_page("alerts")
    table = at.dataframe[0].value
    condition = table[table["name"] == "Hand-edited"]["condition"].iloc[0]
    assert condition.startswith("invalid: alert rule refused:")
    valid = table[table["name"] != "Hand-edited"]["condition"]
    assert len(valid) == len(DEFAULT_RULES) and not valid.str.startswith("invalid").any()


def test_export_leaves_an_invalid_rule_out_with_a_warning(store: Engine, tmp_path: Path) -> None:
    q.ensure_rules(store, [r.model_dump() for r in DEFAULT_RULES])
    q.save_rule(store, BAD)
    res = kvscope("export", "prometheus-rules", env_dir=tmp_path)
    assert res.returncode == 0, res.stderr
    warning, *burn = res.stderr.splitlines()
    assert warning.startswith("warning: left out stored rule 'Hand-edited': alert rule refused:")
    assert all("no SLO to burn" in line for line in burn) and len(burn) == 2
    [group] = yaml.safe_load(res.stdout)["groups"]
    names = {r["labels"]["kvscope_rule"] for r in group["rules"]}
    assert "Hand-edited" not in names
    burning = {r.name for r in DEFAULT_RULES if r.kind.value == "slo_burn"}
    assert names == {r.name for r in DEFAULT_RULES if r.enabled} - burning
