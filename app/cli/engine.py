"""`kvscope engine ...`: configure a managed vLLM engine, ask the worker to start, stop or
restart it, and read its status and log. The worker does the work; these write requests."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from app.cli._shared import settings, store
from planner.errors import InvalidInput, KvscopeError

engine_app = typer.Typer(
    help="The managed vLLM engine: configure, start, stop, logs.", no_args_is_help=True
)


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
    from probes.engine.spec import embedded_spec, parse_env_items, parse_spec
    from storage import queries as q

    db = store()
    try:
        data, _ = q.get_engine_spec(db, name)
    except KvscopeError:  # a new spec: the CPU default for `embedded`, else only what is given
        data = embedded_spec(settings()).model_dump() if name == "embedded" else {"name": name}
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
    q.save_engine_spec(db, spec.name, spec.model_dump())
    typer.echo(spec.command_line(settings().data_dir / "engines" / spec.name))


@engine_app.command("show")
def engine_show(
    name: Annotated[str, typer.Argument()] = "embedded",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Print an engine's spec, the exact command it runs, and its state."""
    from probes.engine.spec import parse_spec
    from storage import queries as q

    db = store()
    data, desired = q.get_engine_spec(db, name)
    spec = parse_spec(data)
    state = q.get_state(db, f"engine:{name}")
    out = {
        "spec": spec.model_dump(),
        "desired": desired,
        "command": spec.command_line(settings().data_dir / "engines" / name),
        "state": state[0] if state else None,
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        typer.echo(out["command"])
        typer.echo(f"desired: {desired}; state: {(state[0] if state else {}).get('status')}")


def _engine_request(kind: str, name: str, timeout: float) -> None:
    """Queue an engine work row and follow the engine's status until the worker is done."""
    from storage import dashboards
    from storage import queries as q

    db = store()
    q.get_engine_spec(db, name)  # NotFound with the known names
    if not dashboards.worker_status(db).alive:
        raise KvscopeError(
            "no kvscope worker is running against this store; the worker carries "
            "out engine requests: start `kvscope worker` (or `kvscope up`)"
        )
    run = q.request_run(db, kind, {"name": name})
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        run = q.get_run(db, run.id)
        state = q.get_state(db, f"engine:{name}")
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

    db = store()
    _, desired = q.get_engine_spec(db, name)
    state = q.get_state(db, f"engine:{name}")
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
    from probes.engine import tail_file

    path = settings().data_dir / "engines" / name / "engine.log"
    if not path.exists():
        raise KvscopeError(f"no log for engine {name!r} at {path}: has it ever started?")
    for line in tail_file(path, lines):
        typer.echo(line)
