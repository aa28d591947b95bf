"""`kvscope simulate`: the tail a model on a GPU would show at a rate, before you have it;
`kvscope simulate calibrate --target NAME`: fit the step cost to an engine kvscope manages
(`--retune`: make only the fit's tuning run again, when the machine's speed has moved);
`kvscope simulate check --target NAME`: replay a later latency run at the calibration's
cost and keep how far its steps drifted (the interval draws from those).

A Typer group whose callback simulates when no subcommand is given; app/cli/__init__.py
registers it as `simulate`. Scenarios come from `planner.simulate.setup` (the same ones the
What-if page builds); a calibration is stored per target and reused by `--target`.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import numpy as np
import typer
from sqlalchemy import Engine

from app.cli._shared import settings
from app.cli.probe import run_local_probe
from planner.errors import InvalidInput
from planner.gpus import get_gpu
from planner.models import load_model
from planner.simulate import roofline
from planner.simulate.calibrate import Calibration, retune_hint
from planner.simulate.setup import SETTING_NAMES, calibrated_scenario, parse_settings, scenario
from planner.simulate.whatif import (
    Prediction,
    RatePoint,
    SloBounds,
    highest,
    sweep,
)


def parse_rates(text: str) -> list[float]:
    """'1,2,5' or 'START:STOP:COUNT' (evenly spaced, both ends included)."""
    try:
        if ":" in text:
            start, stop, count = text.split(":")
            rates = [float(x) for x in np.linspace(float(start), float(stop), int(count))]
        else:
            rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput(
            f"cannot read {text!r} as rates: write 1,2,5 or START:STOP:COUNT (1:20:20)"
        ) from None
    if not rates or any(r <= 0 for r in rates):
        raise InvalidInput(f"rates must be above 0 requests/s, got {text!r}")
    return rates


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.0f}"


def _line(point: RatePoint) -> str:
    p = point.prediction
    interval = point.ttft_p99
    band = f" [{_ms(interval.low)}-{_ms(interval.high)}]" if interval else ""
    share = "" if p.slo_share is None else f"  SLO {p.slo_share:6.1%}"
    flag = "  extrapolated" if p.extrapolation else ""
    return (
        f"{p.rate:8.2f}/s  TTFT p50 {_ms(p.ttft_s.p50):>6} p99 {_ms(p.ttft_s.p99):>7}{band}  "
        f"TPOT p50 {_ms(p.tpot_s.p50):>4} p99 {_ms(p.tpot_s.p99):>5}  E2E p99 "
        f"{_ms(p.e2e_s.p99):>7}  preempt {p.preemptions:>5}  util {p.utilisation:5.0%}"
        f"{share}{flag}"
    )


def _doc(p: Prediction, point: RatePoint) -> dict[str, Any]:
    doc = p.model_dump()
    doc["ttft_p99_interval"] = point.ttft_p99.model_dump() if point.ttft_p99 else None
    doc["e2e_p99_interval"] = point.e2e_p99.model_dump() if point.e2e_p99 else None
    return doc


_SET_HELP = (
    f"Engine setting or workload parameter, key=value (repeatable): {', '.join(SETTING_NAMES)}."
)


simulate_app = typer.Typer(
    help="Predict a vLLM engine's tail (TTFT, TPOT, ITL, E2E, queue) at request rates.",
    invoke_without_command=True,
)


@simulate_app.callback(invoke_without_command=True)
def simulate(
    ctx: typer.Context,
    model: str | None = typer.Option(
        None, "--model", "-m", help="Preset name (e.g. llama-3.1-8b) or path to a config.json."
    ),
    gpu: str | None = typer.Option(None, "--gpu", "-g", help="Catalog GPU (e.g. h100-sxm)."),
    target: str | None = typer.Option(
        None,
        "--target",
        help="A target calibrated with `kvscope simulate calibrate`: its fitted step cost "
        "and engine settings instead of a model, a GPU and a roofline.",
    ),
    rate: float | None = typer.Option(None, "--rate", "-r", help="Requests per second."),
    sweep_rate: str | None = typer.Option(
        None, "--sweep-rate", help="Several rates: 1,2,5 or START:STOP:COUNT (a curve)."
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        "-p",
        help="Workload profile preset (chat, code-review, ...) or a JSON profile; default "
        "fixed lengths (prompt_tokens/output_tokens, 512/128).",
    ),
    set_: Annotated[list[str] | None, typer.Option("--set", help=_SET_HELP)] = None,
    slo_ttft: float | None = typer.Option(None, "--slo-ttft", help="TTFT bound, seconds."),
    slo_tpot: float | None = typer.Option(None, "--slo-tpot", help="TPOT bound, seconds."),
    slo_share: float = typer.Option(
        0.99, "--slo-share", help="Share of requests inside both bounds."
    ),
    seeds: int = typer.Option(
        1, "--seeds", min=1, max=50, help="Runs per rate; 9 or more give an 80% interval on p99."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Predict TTFT, TPOT, ITL, E2E and queue time of a vLLM engine you do not have yet."""
    if ctx.invoked_subcommand is not None:
        return
    if (target is None) == (model is None or gpu is None):
        raise InvalidInput("give --model and --gpu (a roofline), or --target (a calibration)")
    if (rate is None) == (sweep_rate is None):
        raise InvalidInput("give --rate R or --sweep-rate RATES (one of them)")
    rates = [rate] if rate is not None else parse_rates(sweep_rate or "")
    if rate is not None and rate <= 0:
        raise InvalidInput(f"the rate must be above 0 requests/s, got {rate:g}")
    slo = None
    if slo_ttft is not None or slo_tpot is not None:
        if slo_ttft is None or slo_tpot is None or not 0 < slo_share <= 1:
            raise InvalidInput("an SLO needs --slo-ttft and --slo-tpot, and a share in (0, 1]")
        slo = SloBounds(ttft_s=slo_ttft, tpot_s=slo_tpot, share=slo_share)
    loaded: str | dict[str, Any] | None = profile
    if profile is not None and profile.lstrip().startswith("{"):
        try:
            loaded = json.loads(profile)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--profile is not valid JSON: {exc.msg}") from exc
    settings = parse_settings(set_ or ())
    if target is not None:
        stored, now = _stored_calibration(target), time.time()
        what = calibrated_scenario(stored, settings, loaded, slo, now=now)
        title, accounting = f"target {target} (calibrated)", None
        source_error = stored.measured_error()
        if hint := retune_hint(stored, now):
            typer.echo(hint, err=True)
    else:
        assert model is not None and gpu is not None
        what, plan = scenario(load_model(model), get_gpu(gpu), settings, loaded, slo)
        title = f"{plan.request.model.name} on {settings.tensor_parallel_size} x {gpu}"
        accounting = plan.accounting.label if plan.accounting else None
        source_error = roofline.describe()
    points = sweep(what, rates, seeds)
    found = highest(what) if slo is not None else None
    best = None if found is None else found[0]
    if as_json:
        # What the capacity probe compares its first measurement with (--predicted-tpot).
        at_best = None if found is None else found[1].tpot_s.p50
        docs = [_doc(p.prediction, p) for p in points]
        out: dict[str, Any] = docs[0] if rate is not None else {"points": docs}
        out |= {
            "max_rate": best,
            "tpot_p50_at_max_rate": at_best,
            "source": what.source,
            "source_error": source_error,
            "kv_blocks": what.config.num_blocks,
            "vllm_accounting": accounting,
        }
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(title)
    source = what.source if target is not None else f"{what.source} ({source_error})"
    typer.echo(
        f"{what.config.num_blocks:,} KV blocks of {what.config.block_size} tokens, "
        f"max_num_seqs {what.config.max_num_seqs}, max_num_batched_tokens "
        f"{what.config.max_num_batched_tokens:,}; step cost: {source}"
    )
    per_run = (
        f"{what.duration_s:g} s of arrivals" if what.duration_s else f"{what.requests:,} requests"
    )
    typer.echo(f"{per_run} per run; times in ms")
    for point in points:
        typer.echo(_line(point))
    flags = {f for point in points for f in point.prediction.extrapolation}
    for f in sorted(flags):
        typer.echo(f"extrapolation: {f}")
    if slo is not None:
        typer.echo(
            f"highest rate meeting the SLO: {best:.2f} requests/s"
            if best is not None
            else "no rate meets the SLO (even 1% of the engine's capacity misses it)"
        )


def _stored_calibration(target: str, store: Engine | None = None) -> Calibration:
    """The calibration stored for `target` (read from `store`, or from a store of its own)."""
    from probes.kinds.calibration import stored
    from storage import queries as q
    from storage.db import open_store

    own = store is None
    db = open_store(settings().db_url) if store is None else store
    try:
        q.get_target(db, target)  # an unknown name: NotFound, one line
        found = stored(db, target)
    finally:
        if own:
            db.dispose()
    if found is None:
        raise InvalidInput(
            f"target {target} has no calibration yet: run kvscope simulate calibrate "
            f"--target {target}"
        )
    return found


@simulate_app.command("calibrate")
def calibrate(
    target: str = typer.Option(..., "--target", help="A managed engine's target name."),
    as_json: bool = typer.Option(False, "--json", help="Print the calibration as JSON."),
    retune: bool = typer.Option(
        False,
        "--retune",
        help="Keep the stored quiet fit and make only its tuning run again (under a "
        "minute; two on an unsteady host): the machine's speed under load moves with time.",
    ),
) -> None:
    """Measure a managed engine (a batch sweep, lone requests of three prompt lengths, an
    open-loop run at 40 % of its capacity and a short one past the knee: a few minutes) and
    fit the simulator's step cost to it; stored for `--target`."""
    from probes.engine.spec import engine_config, running_spec
    from probes.kinds import KINDS
    from probes.kinds import calibration as measurements
    from storage import queries as q
    from storage.db import open_store

    config = settings()
    store = open_store(config.db_url)
    try:
        known = q.get_target(store, target)
        if not known.managed:
            raise InvalidInput(
                f"target {target} is not an engine kvscope manages: calibration reads the KV "
                "blocks and scheduling limits from a managed engine's spec"
            )
        engine = engine_config(running_spec(store, known.name), config.data_dir)

        def run(kind: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            return run_local_probe(KINDS[kind], target, params)

        def say(line: str) -> None:
            typer.echo(line, err=True)

        if retune:
            stored = _stored_calibration(target, store)
            fitted = measurements.retune(store, run, stored, engine, say=say)
        else:
            fitted = measurements.calibrate_anew(store, run, engine, target, say=say)
        measurements.save(store, target, fitted)
    finally:
        store.dispose()
    if hint := retune_hint(fitted, time.time()):  # (an unsteady host: said at once)
        typer.echo(hint, err=True)
    if as_json:
        typer.echo(fitted.model_dump_json(indent=2))
        return
    typer.echo(fitted.describe(time.time()))
    typer.echo(fitted.quiet_step())


@simulate_app.command("check")
def check(
    target: str = typer.Option(..., "--target", help="A calibrated engine's target name."),
    run_id: int | None = typer.Option(
        None, "--run", help="The latency run to check (default: the newest not checked yet)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the check as JSON."),
) -> None:
    """Replay a latency run made on the engine since its calibration at the calibration's
    step cost, and keep how many times as long its steps ran: from three such checks since
    the tune on, a prediction takes its step cost at their geometric mean, and its 80 %
    interval draws its drift around it."""
    from probes.kinds import calibration as measurements
    from storage import queries as q
    from storage.db import open_store

    config = settings()
    store = open_store(config.db_url)
    try:
        known = q.get_target(store, target)
        stored = _stored_calibration(target, store)
        if run_id is None:  # (the newest not checked yet; `check` refuses one before the tune)
            checked_runs = {c.run for c in stored.checks}
            done = [
                r.id
                for r in q.list_runs(store, kind="latency", limit=500)
                if r.target_id == known.id
                and r.status == "done"
                and measurements.run_label(r.id) not in checked_runs
            ]
            if not done:
                raise InvalidInput(
                    f"target {target} has no finished latency run that is not checked yet: "
                    f"run kvscope probe latency --target {target}"
                )
            run_id = done[0]
        checked = measurements.keep_check(store, known, run_id, config.data_dir)
    finally:
        store.dispose()
    made = checked.checks[-1]
    if as_json:
        typer.echo(made.model_dump_json(indent=2))
        return
    typer.echo(
        f"{made.run}: its steps ran x{made.drift:.2f} as long as the calibration says; "
        f"{checked.describe(time.time())}"
    )
