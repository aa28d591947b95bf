"""`kvscope probe ...`: run a probe against any target from a shell, progress on stderr.

The run is carried out here, in this process, and stored like one the worker ran (kind,
parameters, progress, every request sent), so the console's history shows it too.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer

from planner.errors import InvalidInput, KvscopeError
from storage.settings import Settings

probe_app = typer.Typer(
    help="Run a probe against a vLLM (or OpenAI-compatible) URL.", no_args_is_help=True
)

Target = Annotated[str, typer.Option("--target", help="engine base URL, e.g. http://host:8000")]
Model = Annotated[str | None, typer.Option(help="model name (default: from /v1/models)")]
Json = Annotated[bool, typer.Option("--json", help="print the summary as one JSON object")]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="PARAM=VALUE, repeatable (any parameter of the probe; JSON values allowed)"
    ),
]


class _Bar:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, fraction: float, partial: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self.last < 0.1 and fraction < 1.0:
            return
        self.last = now
        filled = int(30 * min(max(fraction, 0.0), 1.0))
        phase = str(partial.get("phase", ""))[:60]
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%} {phase:<60}")
        sys.stderr.flush()


def _merge(data: dict[str, Any], sets: list[str] | None) -> dict[str, Any]:
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--set wants PARAM=VALUE, got {item!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        data[key.strip()] = value
    return {k: v for k, v in data.items() if v is not None}


def run_cli_probe(
    kind: str,
    target: str,
    data: dict[str, Any],
    model: str | None,
    as_json: bool,
    sets: list[str] | None = None,
) -> dict[str, Any]:
    """Validate, store a running row, run with a progress bar, store and print the outcome."""
    from probes.runner import StoredRun, parse_params
    from storage import queries as q
    from storage.db import open_store
    from storage.schemas import normalize_base_url

    base = normalize_base_url(target)
    store = open_store(Settings().db_url)
    params = parse_params(kind, _merge(data, sets), q.stored_profiles(store))
    known = q.find_target_by_url(store, base)
    if (
        kind == "oom"
        and not (known and known.managed)
        and not params.model_dump().get("allow_external")
    ):
        raise InvalidInput(
            "the OOM probe pushes an engine until it fails: it runs on an engine "
            "kvscope manages, or on another one with --set allow_external=true"
        )
    run = q.start_run(
        store, kind, params.model_dump() | {"target_url": base}, known.id if known else None
    )
    stored = StoredRun(store, run.id, on_progress=_Bar())
    try:
        summary = stored.run(kind, params, base, model=model, managed=bool(known and known.managed))
    except KeyboardInterrupt:
        q.update_run(store, run.id, status="cancelled", error="interrupted (Ctrl-C)")
        sys.stderr.write("\ninterrupted\n")
        raise typer.Exit(130) from None
    except KvscopeError as err:
        q.update_run(store, run.id, status="failed", error=str(err))
        sys.stderr.write("\n")
        raise
    finally:
        store.dispose()
    status = "cancelled" if summary.pop("cancelled", False) else "done"
    store = open_store(Settings().db_url)
    q.update_run(store, run.id, status=status, progress=1.0, summary=summary)
    store.dispose()
    sys.stderr.write(f"\n{kind} run {run.id}: {status}\n")
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """A summary as aligned lines: scalars, and one line per flat mapping."""
    for key, value in summary.items():
        if isinstance(value, dict) and all(not isinstance(v, dict | list) for v in value.values()):
            parts = ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
            typer.echo(f"{key:<22} {parts}")
        elif not isinstance(value, dict | list):
            typer.echo(f"{key:<22} {_fmt(value)}")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


@probe_app.command("latency")
def latency(
    target: Target,
    rate: Annotated[float, typer.Option(help="requests per second")] = 1.0,
    duration: Annotated[float, typer.Option(help="seconds of arrivals")] = 30.0,
    prompt_tokens: Annotated[int | None, typer.Option(help="fixed prompt length")] = None,
    output_tokens: Annotated[int | None, typer.Option(help="fixed answer length")] = None,
    profile: Annotated[str | None, typer.Option(help="workload profile instead")] = None,
    arrival: Annotated[str, typer.Option(help="poisson, constant or gamma")] = "poisson",
    ttft_slo: Annotated[float | None, typer.Option(help="TTFT bound, seconds")] = None,
    tpot_slo: Annotated[float | None, typer.Option(help="TPOT bound, seconds")] = None,
    model: Model = None,
    as_json: Json = False,
    set_: Sets = None,
) -> None:
    """TTFT, ITL, TPOT, E2E and queue time at p50/p95/p99 for a rate and a duration."""
    run_cli_probe(
        "latency",
        target,
        {
            "rate": rate,
            "duration_s": duration,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "profile": profile,
            "arrival": arrival,
            "ttft_slo_s": ttft_slo,
            "tpot_slo_s": tpot_slo,
        },
        model,
        as_json,
        set_,
    )


@probe_app.command("sweep")
def sweep(
    target: Target,
    concurrency: Annotated[
        list[int] | None,
        typer.Option(
            help="concurrencies to try, repeatable (default: 1, 2, 4 ... --max-concurrency)"
        ),
    ] = None,
    max_concurrency: Annotated[
        int,
        typer.Option(
            help="largest concurrency (without --concurrency, the sweep stops two steps "
            "past the knee)"
        ),
    ] = 64,
    requests_per_step: Annotated[int | None, typer.Option(help="default 2 x concurrency")] = None,
    prompt_tokens: Annotated[int, typer.Option()] = 256,
    output_tokens: Annotated[int, typer.Option()] = 128,
    model: Model = None,
    as_json: Json = False,
    set_: Sets = None,
) -> None:
    """Throughput against latency at growing concurrency, and where the knee is."""
    run_cli_probe(
        "batch_sweep",
        target,
        {
            "concurrencies": concurrency or None,
            "max_concurrency": max_concurrency,
            "requests_per_step": requests_per_step,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
        },
        model,
        as_json,
        set_,
    )


@probe_app.command("oom")
def oom(
    target: Target,
    confirm: Annotated[
        bool, typer.Option("--confirm", help="required: the probe pushes the engine until it fails")
    ] = False,
    batch: Annotated[int, typer.Option(help="concurrent sequences per step")] = 4,
    start_context: Annotated[int, typer.Option()] = 1024,
    step: Annotated[int, typer.Option(help="tokens added per step")] = 1024,
    max_context: Annotated[int | None, typer.Option()] = None,
    bisect: Annotated[bool, typer.Option(help="narrow the frontier down after a failure")] = False,
    allow_external: Annotated[
        bool, typer.Option(help="allow an engine kvscope does not manage")
    ] = False,
    model: Model = None,
    as_json: Json = False,
    set_: Sets = None,
) -> None:
    """Grow the context of a batch until the engine queues, preempts, rejects or fails."""
    run_cli_probe(
        "oom",
        target,
        {
            "confirm": confirm,
            "batch": batch,
            "start_context": start_context,
            "step": step,
            "max_context": max_context,
            "search": "bisect" if bisect else "step",
            "allow_external": allow_external,
        },
        model,
        as_json,
        set_,
    )


@probe_app.command("kv-usage")
def kv_usage(
    target: Target,
    rate: Annotated[float, typer.Option(help="requests per second")] = 2.0,
    duration: Annotated[float, typer.Option(help="seconds of load")] = 60.0,
    prompt_tokens: Annotated[int, typer.Option()] = 256,
    prefix_tokens: Annotated[int, typer.Option(help="shared prefix length")] = 128,
    output_tokens: Annotated[int, typer.Option()] = 128,
    model: Model = None,
    as_json: Json = False,
    set_: Sets = None,
) -> None:
    """KV usage under a steady load with growing prefixes: its slope, and whether it returns."""
    run_cli_probe(
        "kv_usage",
        target,
        {
            "rate": rate,
            "duration_s": duration,
            "prompt_tokens": prompt_tokens,
            "prefix_tokens": prefix_tokens,
            "output_tokens": output_tokens,
        },
        model,
        as_json,
        set_,
    )


@probe_app.command("capacity")
def capacity(
    target: Target,
    ttft_slo: Annotated[float, typer.Option(help="TTFT bound, seconds")],
    tpot_slo: Annotated[float, typer.Option(help="TPOT bound, seconds")],
    share: Annotated[float, typer.Option(help="share of requests inside both")] = 0.9,
    start_rate: Annotated[float, typer.Option()] = 1.0,
    max_rate: Annotated[float, typer.Option()] = 64.0,
    duration: Annotated[float, typer.Option(help="seconds per rate")] = 20.0,
    prompt_tokens: Annotated[int | None, typer.Option()] = None,
    output_tokens: Annotated[int | None, typer.Option()] = None,
    profile: Annotated[str | None, typer.Option()] = None,
    model: Model = None,
    as_json: Json = False,
    set_: Sets = None,
) -> None:
    """The highest request rate at which the SLO holds (bracketing, then bisection)."""
    run_cli_probe(
        "capacity",
        target,
        {
            "ttft_slo_s": ttft_slo,
            "tpot_slo_s": tpot_slo,
            "share": share,
            "start_rate": start_rate,
            "max_rate": max_rate,
            "duration_s": duration,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "profile": profile,
        },
        model,
        as_json,
        set_,
    )


profile_app = typer.Typer(
    help="Workload profiles the probes can use by name.", no_args_is_help=True
)


@profile_app.command("save")
def profile_save(
    name: Annotated[str, typer.Argument(help="the name probes will use")],
    file: Annotated[typer.FileText, typer.Option("--file", help="JSON profile ('-': stdin)")],
) -> None:
    """Validate a profile (see `kvscope profile show chat` for the shape) and store it."""
    from probes.workloads import PRESETS, parse_profile
    from storage import queries as q
    from storage.db import open_store
    from storage.schemas import NAME_RE

    if not NAME_RE.match(name) or name in PRESETS:
        raise InvalidInput(
            f"profile name {name!r} must be letters, digits, '.', '_' or '-' "
            f"and not a preset ({', '.join(sorted(PRESETS))})"
        )
    try:
        data = json.load(file)
    except ValueError as err:
        raise InvalidInput(f"the profile is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise InvalidInput("the profile must be a JSON object with a 'kind'")
    profile = parse_profile(data)
    q.save_profile(open_store(Settings().db_url), name, profile.model_dump())
    typer.echo(f"saved profile {name} ({profile.kind})")


@profile_app.command("list")
def profile_list() -> None:
    """The presets and the stored profiles."""
    from probes.workloads import PRESETS
    from storage import queries as q
    from storage.db import open_store

    for name, p in PRESETS.items():
        typer.echo(f"{name:<20} preset  {p.kind}")
    for name, data in sorted(q.stored_profiles(open_store(Settings().db_url)).items()):
        typer.echo(f"{name:<20} stored  {data.get('kind')}")


@profile_app.command("show")
def profile_show(name: Annotated[str, typer.Argument()]) -> None:
    """A profile as JSON (a good start for your own)."""
    from probes.workloads import parse_profile
    from storage import queries as q
    from storage.db import open_store

    stored = q.stored_profiles(open_store(Settings().db_url))
    profile = parse_profile(stored.get(name, name))
    typer.echo(json.dumps(profile.model_dump(), indent=2))
