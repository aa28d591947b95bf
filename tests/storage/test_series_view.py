"""`kvscope series`: a target's series as the Live and Tail pages derive them."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from planner.errors import NotFound, UnknownChoice
from storage.dashboards.monitor import live, series_names, series_view, tail
from storage.db import open_store
from storage.settings import Settings
from tests.support.cli import kvscope
from tests.support.seed import seed


def _same(points: list[tuple[float, float | None]], values: list[float]) -> bool:
    return all(
        (v is None and math.isnan(w)) or (v is not None and v == pytest.approx(w))
        for (_, v), w in zip(points, values, strict=True)
    )


def test_the_series_are_the_pages_own(store: Engine) -> None:
    tid = seed(store, "demo", minutes=5)
    now = time.time()
    view = series_view(store, "demo", 300, now=now)
    assert list(view.series) == series_names()
    frame = live(store, tid, now - 300, now)
    tails = tail(store, tid, now - 300, now)
    assert [t for t, _ in view.series["kv_usage"]] == [float(t) for t in frame.index]
    for name in ("kv_usage", "waiting", "preemptions_per_s", "prefix_hit_rate"):
        assert _same(view.series[name], frame[name].tolist()), name
    assert _same(view.series["ttft_p99"], tails["ttft"]["p99"].tolist())
    assert _same(view.series["itl_ratio"], tails["itl"]["ratio"].tolist())
    assert any(v is not None and 0 < v < 1 for _, v in view.series["kv_usage"])
    assert view.resolution == 0 and view.step_s > 0 and view.rate_window_s > 0


def test_asking_for_one_series_and_bad_names(store: Engine) -> None:
    seed(store, "demo", minutes=2)
    view = series_view(store, "demo", 120, ["ttft_p50"])
    assert list(view.series) == ["ttft_p50"]
    with pytest.raises(UnknownChoice, match=r"unknown series 'kv'; valid choices: .*kv_usage"):
        series_view(store, "demo", 120, ["kv"])
    with pytest.raises(NotFound, match="nope"):
        series_view(store, "nope", 120)


def test_the_cli_prints_them_as_json(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path).db_url)
    seed(store, "demo", minutes=2)
    store.dispose()
    res = kvscope("series", "demo", "--metric", "kv_usage", "--since", "2m", "--json",
                  env_dir=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["target"] == "demo" and list(out["series"]) == ["kv_usage"]
    assert any(v is not None and 0 < v < 1 for _, v in out["series"]["kv_usage"])
    bad = kvscope("series", "demo", "--since", "soon", env_dir=tmp_path)
    assert bad.returncode == 2 and "--since 'soon'" in bad.stderr
