"""`kvscope engine ...`: configure a managed vLLM engine, ask the worker to start, stop or
restart it, and read its status and log. The worker does the work; these write requests,
as the machine's owner, through the guarded actions of `probes.engine.changes`."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.cli._shared import owner, settings, store
from planner.errors import InvalidInput, KvscopeError, NotFound

if TYPE_CHECKING:
    from probes.engine.changes import Verb

engine_app = typer.Typer(
    help="The managed vLLM engine: configure, start, stop, logs.", no_args_is_help=True
)


@engine_app.command("configure")
def engine_configure(
    name: Annotated[str, typer.Argument(help="engine name (also its target name)")] = "embedded",
    model: Annotated[str | None, typer.Option(help="model directory or name")] = None,
    port: Annotated[int | None, typer.Option()] = None,
    host: Annotated[str | None, typer.Option(help="where the engine listens")] = None,
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
            "--env",
            help="KEY=VALUE for the engine's environment, repeatable; KEY= removes KEY; "
            "only variables on the allowlist (docs/engine.md)",
        ),
    ] = None,
    args: Annotated[
        str | None,
        typer.Option(
            "--args",
            help='extra vllm serve flags, replacing the current ones: --args="--seed 1" '
            '(known flags with typed values, docs/engine.md; --args="" clears them)',
        ),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            help="the KVSCOPE_TOKEN_* variable holding the key the engine demands, read when "
            'it is spawned (the key is never stored; "" clears)'
        ),
    ] = None,
    hf_token_env: Annotated[
        str | None,
        typer.Option(
            help="the KVSCOPE_TOKEN_* variable holding a Hugging Face token, read when the "
            'engine is spawned ("" clears)'
        ),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option("--from-file", help="a JSON object of spec fields, applied before the rest"),
    ] = None,
    allow_unsafe: Annotated[
        bool,
        typer.Option(
            "--allow-unsafe",
            help="let this spec step outside the allowlists (LD_PRELOAD for tcmalloc, say); "
            "recorded in the audit log and shown on the Engine page; needed at every save "
            "that keeps such a setting",
        ),
    ] = False,
) -> None:
    """Create or change an engine spec as the machine's owner; a new `embedded` starts from
    the CPU default. Saved, not started: it applies at the next start or restart."""
    from probes.engine import changes
    from probes.engine.spec import embedded_spec, mask_command, parse_env_items
    from storage import queries as q

    db = store()
    try:
        data, _ = q.get_engine_spec(db, name)
    except NotFound:  # a new spec: the CPU default for `embedded`, else only what is given
        data = embedded_spec(settings()).model_dump() if name == "embedded" else {"name": name}
    if from_file is not None:
        data |= _spec_file(from_file)
    for key, value in (
        ("model", model),
        ("port", port),
        ("host", host),
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
    if args is not None:
        try:
            data["extra_args"] = shlex.split(args)
        except ValueError as err:
            raise InvalidInput(f"--args is not a command line: {err}") from err
    for key, ref in (("api_key_env", api_key_env), ("hf_token_env", hf_token_env)):
        if ref is not None:
            data[key] = ref or None
    data["name"] = name
    config = settings()
    spec = changes.configure_engine(db, owner(), data, config.data_dir, allow_unsafe)
    typer.echo(mask_command(spec.command_line(config.data_dir / "engines" / spec.name)))
    for item in spec.unsafe_items:
        typer.echo(f"warning: outside the allowlists (--allow-unsafe): {item}", err=True)
    typer.echo("saved; it applies when the engine is next started or restarted", err=True)


def _spec_file(path: Path) -> dict[str, Any]:
    """Spec fields from the owner's JSON file."""
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise InvalidInput(f"cannot read {path}: {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{path} is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} must hold a JSON object of spec fields")
    return data


@engine_app.command("show")
def engine_show(
    name: Annotated[str, typer.Argument()] = "embedded",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Print an engine's spec, the exact command it runs, and its state (secrets masked)."""
    from probes.engine.spec import mask_command, parse_spec
    from storage import queries as q
    from storage.access import mask

    db = store()
    data, desired = q.get_engine_spec(db, name)
    spec = parse_spec(data)
    started = q.get_started_spec(db, name)
    state = q.get_state(db, f"engine:{name}")
    out = {
        "spec": mask(spec.model_dump()),
        "desired": desired,
        "command": mask_command(spec.command_line(settings().data_dir / "engines" / name)),
        "started_spec": None if started is None else mask(started),
        "saved_differs_from_started": started is not None and started != spec.model_dump(),
        "unsafe": spec.unsafe_items,
        "state": mask(state[0]) if state else None,
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(out["command"])
    typer.echo(f"desired: {desired}; state: {(state[0] if state else {}).get('status')}")
    if out["saved_differs_from_started"]:
        typer.echo("the saved spec differs from the one last started: restart to apply it")
    for item in spec.unsafe_items:
        typer.echo(f"outside the allowlists (--allow-unsafe): {item}")


def _engine_request(verb: Verb, name: str, timeout: float) -> None:
    """Ask the worker (as the machine's owner) and follow the engine's status until done."""
    from probes.engine import changes
    from storage import dashboards
    from storage import queries as q

    db = store()
    q.get_engine_spec(db, name)  # NotFound with the known names
    if not dashboards.worker_status(db).alive:
        raise KvscopeError(
            "no kvscope worker is running against this store; the worker carries "
            "out engine requests: start `kvscope worker` (or `kvscope up`)"
        )
    run = changes.request_engine(db, owner(), verb, name)
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
            f"engine {verb} for {name} did not finish within {timeout:.0f} s "
            f"(run {run.id} is {run.status})"
        )
    if run.status != "done":
        raise KvscopeError(run.error or f"engine {verb} for {name} ended {run.status}")
    typer.echo(f"{name}: {run.summary.get('status')} {run.summary.get('message', '')}".strip())


@engine_app.command("start")
def engine_start(
    name: Annotated[str, typer.Argument()] = "embedded",
    timeout: Annotated[float, typer.Option()] = 900.0,
) -> None:
    """Ask the worker to start an engine; wait until it is healthy."""
    _engine_request("start", name, timeout)


@engine_app.command("stop")
def engine_stop(
    name: Annotated[str, typer.Argument()] = "embedded",
    timeout: Annotated[float, typer.Option()] = 120.0,
) -> None:
    """Ask the worker to stop an engine (gracefully, then by force)."""
    _engine_request("stop", name, timeout)


@engine_app.command("restart")
def engine_restart(
    name: Annotated[str, typer.Argument()] = "embedded",
    timeout: Annotated[float, typer.Option()] = 900.0,
) -> None:
    """Ask the worker to restart an engine (applies a changed spec)."""
    _engine_request("restart", name, timeout)


@engine_app.command("status")
def engine_status(
    name: Annotated[str, typer.Argument()] = "embedded",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Status, uptime, pid and the startup facts vLLM logged."""
    from storage import queries as q
    from storage.access import mask

    db = store()
    _, desired = q.get_engine_spec(db, name)
    state = q.get_state(db, f"engine:{name}")
    data: dict[str, Any] = (
        mask(dict(state[0])) if state else {"name": name, "status": "never started"}
    )
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
