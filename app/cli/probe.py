"""`kvscope probe ...`: run a probe against a stored target or any URL, progress on stderr.

One command per registered probe kind, built from the kind's declaration: its options,
their types, defaults and help come from the kind's `Params`, so they are never typed
twice. The run is carried out here, in this process, and stored like one the worker ran
(kind, parameters, progress, every request sent), so the console's history shows it too.
"""

from __future__ import annotations

import inspect
import json
import sys
import time
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import typer
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from app.cli._shared import owner, print_summary, settings
from planner.errors import InvalidInput, KvscopeError
from probes.kinds import KINDS, AnyKind, CliOption, ProbeProgress

probe_app = typer.Typer(
    help="Run a probe against a stored target (by name) or a vLLM (or OpenAI-compatible) URL.",
    no_args_is_help=True,
)

TargetOpt = Annotated[
    str,
    typer.Option(
        "--target",
        help="a stored target's name (its token is sent) or an engine base URL, "
        "e.g. http://host:8000",
    ),
]
TokenEnv = Annotated[
    str | None,
    typer.Option(
        "--token-env",
        help="with a URL: env variable holding a bearer token (its name starts KVSCOPE_TOKEN_)",
    ),
]
Model = Annotated[str | None, typer.Option(help="model name (default: the engine's first)")]
Json = Annotated[bool, typer.Option("--json", help="print the result as one JSON object")]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="PARAM=VALUE, repeatable (any parameter of the probe; JSON values allowed)"
    ),
]
_COMMON = ("target", "token_env", "model", "as_json", "set_")


class _Bar:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, fraction: float, progress: ProbeProgress) -> None:
        now = time.monotonic()
        if now - self.last < 0.1 and fraction < 1.0:
            return
        self.last = now
        # A Poisson run may send more requests than the expected count it is measured by.
        shown = min(max(fraction, 0.0), 1.0)
        filled = int(30 * shown)
        phase = progress.phase[:60]
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {shown:4.0%} {phase:<60}")
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
    kind: AnyKind,
    target: str,
    data: dict[str, Any],
    *,
    model: str | None = None,
    as_json: bool = False,
    sets: list[str] | None = None,
    token_env: str | None = None,
) -> None:
    """Validate, store a running row, run with a progress bar, store and print the outcome."""
    _, summary = run_local_probe(kind, target, data, model=model, sets=sets, token_env=token_env)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        print_summary(summary)


def run_local_probe(
    kind: AnyKind,
    target: str,
    data: dict[str, Any],
    *,
    model: str | None = None,
    sets: list[str] | None = None,
    token_env: str | None = None,
) -> tuple[int, dict[str, Any]]:
    """Run a probe in this process, stored like one the worker ran; its run id and summary."""
    from probes.engine.spec import address
    from probes.kinds import StoredRun, calibration
    from probes.kinds.context import stored
    from probes.kinds.requests import begin_local_probe
    from probes.vllm.client import Target
    from storage import queries as q
    from storage.db import open_store

    config = settings()
    store = open_store(config.db_url)
    allow = q.allowlist(store, config.allowed_hosts)
    if "://" in target:
        known = q.find_target_by_url(store, target)
        where = Target.resolve(target, token_env, allow=allow)
    else:  # a stored target by name: its own address and token
        known = q.get_target(store, target)
        if token_env:
            raise InvalidInput("--token-env goes with a URL; a stored target has its own")
        where = address(store, known, allow)
    where.check(where.base_url)  # a host off the allowlist: refused before a run is stored
    managed = bool(known and known.managed)
    run, params = begin_local_probe(
        store,
        owner(),
        kind.name,
        _merge(data, sets),
        config.probe_limits,
        known,
        where.base_url,
    )
    spec = None
    if known is not None and known.managed:
        from probes.engine.spec import running_spec

        spec = running_spec(store, known.name)
    fitted = calibration.stored(store, known.name) if known is not None else None
    runner = StoredRun(store, run.id, on_progress=_Bar())
    try:
        outcome = runner.run(
            kind, params, where, model=model, managed=managed, spec=spec, calibration=fitted
        )
    except KeyboardInterrupt:
        q.update_run(store, run.id, status="cancelled", error="interrupted (Ctrl-C)")
        sys.stderr.write("\ninterrupted\n")
        raise typer.Exit(130) from None
    except KvscopeError as err:
        q.update_run(store, run.id, status="failed", error=str(err))
        sys.stderr.write("\n")
        raise
    summary = stored(outcome.result)
    status = "cancelled" if outcome.cancelled else "done"
    q.update_run(store, run.id, status=status, progress=1.0, summary=summary)
    store.dispose()
    sys.stderr.write(f"\n{kind.name} run {run.id}: {status}\n")
    return run.id, summary


# --- one command per kind, built from its declaration ----------------------------------


def _option_type(field: FieldInfo) -> Any:
    """The CLI type of a Params field: its scalar or list type; a Literal or anything richer
    (a profile given as a name) is read as text and validated by the kind's Params."""
    ann = field.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        optional = len(args) < len(typing.get_args(ann))
        inner = args[0] if len(args) == 1 else str
    else:
        optional, inner = False, ann
    if typing.get_origin(inner) is list:
        return list[typing.get_args(inner)[0]] | None  # type: ignore[misc]
    if inner not in (int, float, str, bool):
        inner = str
    return inner | None if optional or field.default is None else inner


def _parameter(kind: AnyKind, opt: CliOption) -> inspect.Parameter:
    field = kind.params.model_fields[opt.field]
    help_text = opt.help or field.description or ""
    name = (opt.flag or opt.field).replace("-", "_")
    if opt.sets is not None:  # a plain switch that stores a value
        return inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[bool, typer.Option(opt.option, help=help_text)],
            default=False,
        )
    required = field.default is PydanticUndefined and field.default_factory is None
    default = inspect.Parameter.empty if required else field.get_default(call_default_factory=True)
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[_option_type(field), typer.Option(opt.option, help=help_text)],
        default=default,
    )


def _common() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter("target", kw, annotation=TargetOpt),
        inspect.Parameter("token_env", kw, annotation=TokenEnv, default=None),
        inspect.Parameter("model", kw, annotation=Model, default=None),
        inspect.Parameter("as_json", kw, annotation=Json, default=False),
        inspect.Parameter("set_", kw, annotation=Sets, default=None),
    ]


def command_for(kind: AnyKind) -> Callable[..., None]:
    """The Typer command of a probe kind: its options, then the common ones."""
    own = {(o.flag or o.field).replace("-", "_"): o for o in kind.cli}

    def command(**values: Any) -> None:
        data: dict[str, Any] = {}
        for name, opt in own.items():
            value = values[name]
            if opt.sets is not None:
                if value:
                    data[opt.field] = opt.sets
            elif value not in (None, []):
                data[opt.field] = value
        run_cli_probe(
            kind,
            values["target"],
            data,
            model=values["model"],
            as_json=values["as_json"],
            sets=values["set_"],
            token_env=values["token_env"],
        )

    params = [_parameter(kind, o) for o in kind.cli]
    command.__signature__ = inspect.Signature(params + _common())  # type: ignore[attr-defined]
    command.__doc__ = kind.summary
    command.__name__ = kind.command.replace("-", "_")
    return command


def commands() -> Mapping[str, AnyKind]:
    """Every probe command and its kind."""
    return {k.command: k for k in KINDS.values()}


for _name, _kind in commands().items():
    probe_app.command(_name)(command_for(_kind))


profile_app = typer.Typer(
    help="Workload profiles the probes can use by name.", no_args_is_help=True
)


@profile_app.command("save")
def profile_save(
    name: Annotated[str, typer.Argument(help="the name probes will use")],
    file: Annotated[typer.FileText, typer.Option("--file", help="JSON profile ('-': stdin)")],
) -> None:
    """Validate a profile (see `kvscope profile show chat` for the shape) and store it."""
    from probes.kinds.requests import save_profile
    from storage.db import open_store

    try:
        data = json.load(file)
    except ValueError as err:
        raise InvalidInput(f"the profile is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise InvalidInput("the profile must be a JSON object with a 'kind'")
    profile = save_profile(open_store(settings().db_url), owner(), name, data)
    typer.echo(f"saved profile {name} ({profile.kind})")


@profile_app.command("list")
def profile_list() -> None:
    """The presets and the stored profiles."""
    from planner.workload import PRESETS
    from storage import queries as q
    from storage.db import open_store

    for name, p in PRESETS.items():
        typer.echo(f"{name:<20} preset  {p.kind}")
    for name, data in sorted(q.stored_profiles(open_store(settings().db_url)).items()):
        typer.echo(f"{name:<20} stored  {data.get('kind')}")


@profile_app.command("show")
def profile_show(name: Annotated[str, typer.Argument()]) -> None:
    """A profile as JSON (a good start for your own)."""
    from planner.workload import parse_profile
    from storage import queries as q
    from storage.db import open_store

    stored = q.stored_profiles(open_store(settings().db_url))
    profile = parse_profile(stored.get(name, name))
    typer.echo(json.dumps(profile.model_dump(), indent=2))
