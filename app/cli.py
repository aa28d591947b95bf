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
from typing import Annotated

import httpx
import typer

from app.plan_cli import plan
from planner.errors import KvscopeError
from storage.settings import Settings

app = typer.Typer(
    name="kvscope",
    help="Capacity planning and live monitoring for vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
target_app = typer.Typer(help="Manage the engines kvscope scrapes.", no_args_is_help=True)
app.add_typer(target_app, name="target")
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
        return
    for key, value in summary.items():
        if isinstance(value, dict):
            parts = ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
            typer.echo(f"{key:<24} {parts}")
        else:
            typer.echo(f"{key:<24} {_fmt(value)}")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


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


@app.command()
def up() -> None:
    """Run worker and console together until Ctrl-C; both are stopped by PID on exit."""
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    from storage.db import open_store

    open_store(settings.db_url)  # migrate once, before two processes race to do it
    exe = [sys.executable, "-m", "app.cli"]
    procs = [
        subprocess.Popen([*exe, "worker"]),
        subprocess.Popen(_console_argv(settings), cwd=ROOT),
    ]
    typer.echo(
        f"kvscope console: http://{settings.console_host}:{settings.console_port}  "
        f"(data in {settings.data_dir}; Ctrl-C stops)"
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
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    dead = [p for p in procs if p.returncode not in (0, -signal.SIGTERM, None)]
    if dead and not stop:
        raise KvscopeError(f"a kvscope process exited with code {dead[0].returncode}")


if __name__ == "__main__":
    main()
