"""`kvscope worker`, `console` and `up`: the long-running processes, in the foreground.

`up` starts the other two as child processes (`python -m app.cli worker` and Streamlit)
and stops both by PID when either ends or on Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from app.cli._shared import ROOT, log_setup, owner, settings
from planner.errors import KvscopeError, NotFound
from storage.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine


def worker(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run the worker in the foreground: scrape targets, roll up, pick up requested work."""
    from probes.worker.service import Worker

    log_setup(verbose)
    Worker(settings()).run_forever()


def _console_argv(config: Settings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "app" / "main.py"),
        "--server.headless=true",
        f"--server.address={config.console_host}",
        f"--server.port={config.console_port}",
        "--browser.gatherUsageStats=false",
    ]


def _refuse_open_console(config: Settings) -> None:
    """Bound beyond loopback, the console needs sign-in: refused before anything starts."""
    from storage.access.users import refuse_open_console, signin_mode

    refuse_open_console(config.console_host, signin_mode(config.users_file))


def console() -> None:
    """Run the Streamlit console in the foreground."""
    config = settings()
    _refuse_open_console(config)
    config.private_data_dir()
    os.chdir(ROOT)  # Streamlit reads .streamlit/config.toml from the working directory
    os.execv(sys.executable, _console_argv(config))


def _prepare_embedded(config: Settings, store: Engine) -> None:
    """Build the tiny model once, store the default CPU engine spec unless one is stored
    (as the machine's owner), and want it running: the worker starts it."""
    from probes.engine import changes
    from probes.engine.spec import build_tiny_model, embedded_spec, parse_spec, preflight
    from storage import queries as q

    typer.echo("kvscope: building the tiny model if needed (once, a few seconds)...")
    build_tiny_model(config)
    try:
        data, _ = q.get_engine_spec(store, "embedded")
        spec = parse_spec(data)
    except KvscopeError as err:
        if not isinstance(err, NotFound):
            typer.echo(f"warning: the stored embedded spec is replaced by the default: {err}")
        default = embedded_spec(config).model_dump()
        spec = changes.configure_engine(store, owner(), default, config.data_dir)
    changes.keep_running(store, owner(), spec.name)
    for problem in preflight(spec, data_dir=config.data_dir):
        typer.echo(f"warning: the embedded engine may not start: {problem}", err=True)


def up(
    embedded: Annotated[
        bool, typer.Option(help="also run the embedded engine: vLLM on CPU, tiny local model")
    ] = True,
    demo_load: Annotated[
        bool, typer.Option(help="send a light load to the embedded engine so charts move")
    ] = True,
) -> None:
    """Run worker and console together until Ctrl-C; both are stopped by PID on exit."""
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    # From the start: a Ctrl-C while the tiny model is built (native code that may swallow
    # KeyboardInterrupt) must still stop it, before anything is spawned.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    config = settings()
    _refuse_open_console(config)
    config.private_data_dir()
    from storage.db import open_store

    store = open_store(config.db_url)  # migrate once, before two processes race to do it
    if embedded:
        _prepare_embedded(config, store)
    if stop:
        return
    exe = [sys.executable, "-m", "app.cli"]
    env = {**os.environ, "KVSCOPE_DEMO_LOAD": "1" if (embedded and demo_load) else "0"}
    procs = [
        subprocess.Popen([*exe, "worker"], env=env),
        subprocess.Popen(_console_argv(config), cwd=ROOT),
    ]
    typer.echo(
        f"kvscope console: http://{config.console_host}:{config.console_port}  "
        f"(data in {config.data_dir}; Ctrl-C stops)"
    )
    if embedded:
        typer.echo(
            "the embedded vLLM engine is starting; its first start takes about a minute on "
            "2 cores (Engine page: status and log)"
        )
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
