"""The `kvscope` command line (Typer): console, worker, scrape, targets, plan and friends.

Every command raises `KvscopeError` for anything a user got wrong or the world refused;
`main()` turns that into one line on stderr and exit code 2. Settings are built here, at
the entry point, and handed down.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from sqlalchemy import Engine

from app.plan_cli import plan
from app.probe_cli import print_summary, probe_app, profile_app
from planner.errors import InvalidInput, KvscopeError
from storage.settings import Settings

app = typer.Typer(
    name="kvscope",
    help="Capacity planning and live monitoring for vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
target_app = typer.Typer(help="Manage the engines kvscope scrapes.", no_args_is_help=True)
engine_app = typer.Typer(
    help="The managed vLLM engine: configure, start, stop, logs.", no_args_is_help=True
)
model_app = typer.Typer(help="Local models for the embedded engine.", no_args_is_help=True)
app.add_typer(target_app, name="target")
app.add_typer(engine_app, name="engine")
app.add_typer(model_app, name="model")
app.add_typer(probe_app, name="probe")
app.add_typer(profile_app, name="profile")
export_app = typer.Typer(
    help="Files for teams that already run Prometheus and Grafana.", no_args_is_help=True
)
app.add_typer(export_app, name="export")
app.command("plan")(plan)

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    """Entry point of the console script."""
    import click

    try:
        rc = app(standalone_mode=False)
    except KvscopeError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as err:
        err.show()
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


def _settings() -> Settings:
    return Settings()


def _log_setup(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


# --- scrape --------------------------------------------------------------------------------


@app.command()
def scrape(
    url: Annotated[str, typer.Argument(help="engine base URL or its /metrics URL")],
    once: Annotated[bool, typer.Option("--once", help="scrape one time and exit")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    token_env: Annotated[
        str | None, typer.Option(help="env variable holding a bearer token")
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the engine")] = 5.0,
) -> None:
    """Fetch one /metrics and print the canonical values (p50/p95/p99 since engine start)."""
    from probes.metrics import summarize
    from probes.scrape import scrape as do_scrape
    from storage.schemas import normalize_base_url

    base = normalize_base_url(url)
    with httpx.Client() as client:
        summary = summarize(do_scrape(client, base, token_env, timeout))
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        print_summary(summary)


# --- targets -------------------------------------------------------------------------------


@target_app.command("add")
def target_add(
    name: Annotated[str, typer.Argument(help="a short unique name")],
    url: Annotated[str, typer.Argument(help="engine base URL, e.g. http://10.0.0.5:8000")],
    token_env: Annotated[
        str | None, typer.Option(help="env variable holding a bearer token")
    ] = None,
) -> None:
    """Attach an external vLLM engine; the worker starts scraping it within a second."""
    from storage import queries as q
    from storage.db import open_store

    engine = open_store(_settings().db_url)
    row = q.add_target(
        engine, q.parse_target({"name": name, "base_url": url, "token_env": token_env})
    )
    typer.echo(f"added target {row.name} ({row.base_url})")


@target_app.command("list")
def target_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List targets with their health."""
    from storage import queries as q
    from storage.db import open_store

    rows = q.list_targets(open_store(_settings().db_url))
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in rows], indent=2))
        return
    for r in rows:
        typer.echo(f"{r.name:<20} {r.health:<9} {r.base_url}  {r.health_message or ''}")


@target_app.command("remove")
def target_remove(name: Annotated[str, typer.Argument()]) -> None:
    """Remove a target and its stored history."""
    from storage import queries as q
    from storage.db import open_store

    q.remove_target(open_store(_settings().db_url), name)
    typer.echo(f"removed target {name}")


# --- managed engine ------------------------------------------------------------------------


def _store() -> Engine:
    from storage.db import open_store

    return open_store(_settings().db_url)


@engine_app.command("configure")
def engine_configure(
    name: Annotated[str, typer.Argument(help="engine name (also its target name)")] = "embedded",
    model: Annotated[str | None, typer.Option(help="model directory or name")] = None,
    port: Annotated[int | None, typer.Option()] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda")] = None,
    python: Annotated[str | None, typer.Option(help="the engine venv's python")] = None,
    vllm: Annotated[str | None, typer.Option(help="a vllm executable instead of python")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="FIELD=VALUE, repeatable "
            "(max_model_len, kv_cache_memory_bytes, block_size, dtype, ...)",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env", help="KEY=VALUE for the engine's environment, repeatable; KEY= removes KEY"
        ),
    ] = None,
) -> None:
    """Create or change an engine spec; a new `embedded` starts from the CPU default."""
    from probes.engine import embedded_spec, parse_env_items, parse_spec
    from storage import queries as q

    store = _store()
    try:
        data, _ = q.get_engine_spec(store, name)
    except KvscopeError:  # a new spec: the CPU default for `embedded`, else only what is given
        data = embedded_spec(_settings()).model_dump() if name == "embedded" else {"name": name}
    for key, value in (
        ("model", model),
        ("port", port),
        ("device", device),
        ("python", python),
        ("vllm", vllm),
    ):
        if value is not None:
            data[key] = value
    if vllm is not None:
        data["python"] = None
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidInput(f"--set wants FIELD=VALUE, got {item!r}")
        data[key.strip()] = None if value.strip() in ("", "none", "None") else value.strip()
    if env:
        data["env"] = parse_env_items(env, dict(data.get("env") or {}))
    spec = parse_spec(data)
    q.save_engine_spec(store, spec.name, spec.model_dump())
    typer.echo(spec.command_line(_settings().data_dir / "engines" / spec.name))


@engine_app.command("show")
def engine_show(
    name: Annotated[str, typer.Argument()] = "embedded",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Print an engine's spec, the exact command it runs, and its state."""
    from probes.engine import parse_spec
    from storage import queries as q

    store = _store()
    data, desired = q.get_engine_spec(store, name)
    spec = parse_spec(data)
    state = q.get_state(store, f"engine:{name}")
    out = {
        "spec": spec.model_dump(),
        "desired": desired,
        "command": spec.command_line(_settings().data_dir / "engines" / name),
        "state": state[0] if state else None,
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        typer.echo(out["command"])
        typer.echo(f"desired: {desired}; state: {(state[0] if state else {}).get('status')}")


def _engine_request(kind: str, name: str, timeout: float) -> None:
    from storage import dashboards
    from storage import queries as q

    store = _store()
    q.get_engine_spec(store, name)  # NotFound with the known names
    if not dashboards.worker_status(store).alive:
        raise KvscopeError(
            "no kvscope worker is running against this store; the worker carries "
            "out engine requests: start `kvscope worker` (or `kvscope up`)"
        )
    run = q.request_run(store, kind, {"name": name})
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        run = q.get_run(store, run.id)
        state = q.get_state(store, f"engine:{name}")
        status = str(state[0].get("status")) if state else "?"
        if status != last:
            typer.echo(f"{name}: {status}", err=True)
            last = status
        if run.status not in ("queued", "running"):
            break
        time.sleep(0.5)
    else:
        raise KvscopeError(
            f"{kind} for {name} did not finish within {timeout:.0f} s "
            f"(run {run.id} is {run.status})"
        )
    if run.status != "done":
        raise KvscopeError(run.error or f"{kind} for {name} ended {run.status}")
    typer.echo(f"{name}: {run.summary.get('status')} {run.summary.get('message', '')}".strip())


@engine_app.command("start")
def engine_start(
    name: Annotated[str, typer.Argument()] = "embedded",
    timeout: Annotated[float, typer.Option()] = 900.0,
) -> None:
    """Ask the worker to start an engine; wait until it is healthy."""
    _engine_request("engine_start", name, timeout)


@engine_app.command("stop")
def engine_stop(
    name: Annotated[str, typer.Argument()] = "embedded",
    timeout: Annotated[float, typer.Option()] = 120.0,
) -> None:
    """Ask the worker to stop an engine (gracefully, then by force)."""
    _engine_request("engine_stop", name, timeout)


@engine_app.command("restart")
def engine_restart(
    name: Annotated[str, typer.Argument()] = "embedded",
    timeout: Annotated[float, typer.Option()] = 900.0,
) -> None:
    """Ask the worker to restart an engine (applies a changed spec)."""
    _engine_request("engine_restart", name, timeout)


@engine_app.command("status")
def engine_status(
    name: Annotated[str, typer.Argument()] = "embedded",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Status, uptime, pid and the startup facts vLLM logged."""
    from storage import queries as q

    store = _store()
    _, desired = q.get_engine_spec(store, name)
    state = q.get_state(store, f"engine:{name}")
    data: dict[str, Any] = dict(state[0]) if state else {"name": name, "status": "never started"}
    data["desired"] = desired
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    up_s = time.time() - data["started_at"] if data.get("started_at") else None
    typer.echo(
        f"{name}: {data.get('status')} (desired {desired})"
        + (f", pid {data['pid']}, up {up_s:.0f} s" if data.get("pid") and up_s else "")
    )
    if data.get("message"):
        typer.echo(f"  {data['message']}")
    for key, value in (data.get("facts") or {}).items():
        typer.echo(f"  {key}: {value}")


@engine_app.command("logs")
def engine_logs(
    name: Annotated[str, typer.Argument()] = "embedded",
    lines: Annotated[int, typer.Option("--lines", "-n")] = 50,
) -> None:
    """The last lines of the engine's log file."""
    from probes.manager import tail_file

    path = _settings().data_dir / "engines" / name / "engine.log"
    if not path.exists():
        raise KvscopeError(f"no log for engine {name!r} at {path}: has it ever started?")
    for line in tail_file(path, lines):
        typer.echo(line)


@model_app.command("build-tiny")
def model_build_tiny(
    out: Annotated[Path | None, typer.Option(help="default: DATA_DIR/models/tiny-llama")] = None,
    layers: Annotated[int, typer.Option()] = 2,
    kv_heads: Annotated[int, typer.Option()] = 2,
    head_dim: Annotated[int, typer.Option()] = 32,
    dtype: Annotated[str, typer.Option()] = "float32",
) -> None:
    """Build the tiny random-weight Llama and its tokenizer locally (once; nothing from a hub)."""
    from probes.engine import build_tiny_model
    from probes.tinymodel import TinyParams

    try:
        params = TinyParams(
            layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype
        ).resolved()
    except ValueError as err:
        raise InvalidInput(str(err)) from err
    typer.echo(str(build_tiny_model(_settings(), out, params)))


# --- exports -------------------------------------------------------------------------------


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text)
    except OSError as err:
        raise KvscopeError(f"cannot write {out}: {err.strerror}") from err
    typer.echo(f"wrote {out}", err=True)


@export_app.command("prometheus-rules")
def export_rules(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="file (default: stdout)")] = None,
    job: Annotated[str, typer.Option(help="the Prometheus job that scrapes vLLM")] = "vllm",
) -> None:
    """The alert rules (as stored, or the defaults) as a Prometheus alerting-rules file."""
    from app.exports import prometheus_rules_yaml
    from probes.rules import DEFAULT_RULES, parse_rule
    from storage import queries as q

    stored = q.list_rules(_store())
    rules = [parse_rule(data) for _, data in stored] if stored else list(DEFAULT_RULES)
    _write(prometheus_rules_yaml(rules, job=job), out)


@export_app.command("grafana-dashboard")
def export_dashboard(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="file (default: stdout)")] = None,
    datasource: Annotated[
        str, typer.Option(help="Prometheus datasource uid (default: ask at import)")
    ] = "${DS_PROMETHEUS}",
) -> None:
    """A Grafana dashboard with the Live and Tail panels over Prometheus."""
    from app.exports import grafana_dashboard_json

    _write(grafana_dashboard_json(datasource_uid=datasource), out)


# --- processes -----------------------------------------------------------------------------


@app.command()
def worker(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run the worker in the foreground: scrape targets, roll up, pick up requested work."""
    from probes.worker import Worker

    _log_setup(verbose)
    Worker(_settings()).run_forever()


def _console_argv(settings: Settings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "app" / "main.py"),
        "--server.headless=true",
        f"--server.address={settings.console_host}",
        f"--server.port={settings.console_port}",
        "--browser.gatherUsageStats=false",
    ]


@app.command()
def console() -> None:
    """Run the Streamlit console in the foreground."""
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # Streamlit reads .streamlit/config.toml from the working directory
    os.execv(sys.executable, _console_argv(settings))


def _prepare_embedded(settings: Settings, store: Engine) -> None:
    """Build the tiny model once and store the default CPU engine spec, wanted running."""
    from probes.engine import build_tiny_model, embedded_spec, parse_spec, preflight
    from storage import queries as q

    typer.echo("kvscope: building the tiny model if needed (once, a few seconds)...")
    build_tiny_model(settings)
    try:
        data, _ = q.get_engine_spec(store, "embedded")
        spec = parse_spec(data)
    except KvscopeError:
        spec = embedded_spec(settings)
        q.save_engine_spec(store, spec.name, spec.model_dump())
    q.set_desired_state(store, spec.name, "running")
    for problem in preflight(spec):
        typer.echo(f"warning: the embedded engine may not start: {problem}", err=True)


@app.command()
def up(
    embedded: Annotated[
        bool, typer.Option(help="also run the embedded engine: vLLM on CPU, tiny local model")
    ] = True,
    demo_load: Annotated[
        bool, typer.Option(help="send a light load to the embedded engine so charts move")
    ] = True,
) -> None:
    """Run worker and console together until Ctrl-C; both are stopped by PID on exit."""
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    from storage.db import open_store

    store = open_store(settings.db_url)  # migrate once, before two processes race to do it
    if embedded:
        _prepare_embedded(settings, store)
    exe = [sys.executable, "-m", "app.cli"]
    env = {**os.environ, "KVSCOPE_DEMO_LOAD": "1" if (embedded and demo_load) else "0"}
    procs = [
        subprocess.Popen([*exe, "worker"], env=env),
        subprocess.Popen(_console_argv(settings), cwd=ROOT),
    ]
    typer.echo(
        f"kvscope console: http://{settings.console_host}:{settings.console_port}  "
        f"(data in {settings.data_dir}; Ctrl-C stops)"
    )
    if embedded:
        typer.echo(
            "the embedded vLLM engine is starting; its first start takes about a minute on "
            "2 cores (Engine page: status and log)"
        )
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stop and all(p.poll() is None for p in procs):
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:  # the worker stops its engine first: SIGTERM, then SIGKILL after 30 s
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    dead = [p for p in procs if p.returncode not in (0, -signal.SIGTERM, None)]
    if dead and not stop:
        raise KvscopeError(f"a kvscope process exited with code {dead[0].returncode}")


if __name__ == "__main__":
    main()
