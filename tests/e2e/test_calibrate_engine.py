"""`kvscope simulate calibrate --retune` against the real CPU engine: the stored quiet fit
kept, one open-loop run made on the engine, the load's scale, the host's speed and its
noise measured again and stored. (A whole calibration takes minutes: benchmarks/.)"""

from __future__ import annotations

import json
import time

import pytest

from planner.simulate.calibrate import CALIBRATION_KEY, LOAD_PARAMS, Calibration, fit
from probes.engine.spec import engine_config, parse_spec
from probes.kinds.calibration import save as save_calibration
from storage import queries as q
from storage.settings import Settings
from tests.e2e.conftest import LiveWorker
from tests.planner.test_calibrate import samples
from tests.support.cli import kvscope

pytestmark = pytest.mark.engine

QUIET = ("overhead_s", "token_s", "seq_s", "pair_s", "api_s", "residual_low", "samples")


def test_a_retune_measures_the_engine_again_and_keeps_the_quiet_fit(
    live: LiveWorker, cpu_engine: str, e2e_settings: Settings
) -> None:
    store = live.worker.store
    spec = parse_spec(q.get_started_spec(store, "embedded") or {})
    config = engine_config(spec, e2e_settings.data_dir)
    decodes, prefills = samples()
    old = time.time() - 3 * 3600
    stored = fit(decodes, prefills, config).model_copy(
        update={"target": "embedded", "fitted_at": old, "tuned_at": old, "tuned_rate": 2.0}
    )
    save_calibration(store, "embedded", stored)
    stale = kvscope(
        "simulate", "--target", "embedded", "--rate", "1", "--set", "num_requests=50",
        env_dir=e2e_settings.data_dir,
    )  # fmt: skip
    assert stale.returncode == 0 and "--target embedded --retune" in stale.stderr
    before = {r.id for r in q.list_runs(store, kind="latency")}

    res = kvscope(
        "simulate", "calibrate", "--target", "embedded", "--retune", "--json",
        env_dir=e2e_settings.data_dir, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    again = Calibration.model_validate_json(res.stdout)
    # The quiet fit's rows are the stored ones; the tune is new, measured on the engine
    # just now: its steps read back and fitted on beside those rows where there were
    # enough of each kind, else the stored coefficients kept as they were.
    assert (again.quiet_rows, again.quiet_s, again.samples) == (
        stored.quiet_rows, stored.quiet_s, stored.samples,
    )  # fmt: skip
    if again.step_kinds:
        assert f"fitted again with {again.step_kinds} kinds of its steps" in again.describe()
    else:
        assert {k: getattr(again, k) for k in QUIET} == {k: getattr(stored, k) for k in QUIET}
    assert again.tuned_at is not None and time.time() - again.tuned_at < 120
    assert again.fitted_at == pytest.approx(old)
    assert again.tuned_rate == 2.0 and again.noise and again.speed
    assert again.load_scale != stored.load_scale  # the real engine is not the made-up fit
    # How far the stored calibration missed the new run is kept as a check.
    assert [c.run for c in again.checks] == ["retune"] and again.checks[0].drift != 1.0
    # One open-loop run of the tuning shape at the stored rate, with prompts of its own;
    # made once more where the host ran it unsteady (a busy machine), said on stderr.
    runs = [r for r in q.list_runs(store, kind="latency") if r.id not in before]
    made_again = "the run to tune on made again" in res.stderr
    assert len(runs) == 1 + made_again and all(r.status == "done" for r in runs)
    assert {r.params["rate"] for r in runs} == {2.0}
    seeds = {r.params["seed"] for r in runs}
    assert len(seeds) == len(runs) and LOAD_PARAMS["seed"] not in seeds
    # Stored: a prediction reads the new tune, and no longer says to make it again.
    found = q.get_state(store, CALIBRATION_KEY.format("embedded"))
    assert found is not None and Calibration.model_validate(found[0]) == again
    fresh = kvscope(
        "simulate", "--target", "embedded", "--rate", "1", "--set", "num_requests=50", "--json",
        env_dir=e2e_settings.data_dir,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert "--retune" not in fresh.stderr
    assert json.loads(fresh.stdout)["source"].endswith("; fitted 3 h ago, tuned under a minute ago")
