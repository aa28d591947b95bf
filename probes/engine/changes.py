"""Engine configuration, start, stop and restart as guarded actions: the console's and the
CLI's only way to change a managed engine. Each checks the person's role, refuses what their
origin may not do, records who asked, and lands in the audit log.

Who may set what (docs/engine.md): an admin in a browser edits a stored spec within the
allowlists; the model, the executable, the host, the secrets' variables, owner-only flags
and anything outside the allowlists stay as the machine's owner set them from the CLI, where
stepping outside the allowlists takes `allow_unsafe`. An operator starts, stops and restarts;
from a browser, stop and restart need the engine's name typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Engine

from planner.errors import Forbidden, InvalidInput, NotFound
from probes.engine.allowlists import OWNER_ONLY, outside_data_dir, owner_items
from probes.engine.spec import EngineSpec, parse_spec
from storage import queries as q
from storage.access import Action, Actor, Origin, guarded
from storage.schemas import RunRow

Verb = Literal["start", "stop", "restart"]
ACTIONS: dict[Verb, Action] = {
    "start": Action.ENGINE_START,
    "stop": Action.ENGINE_STOP,
    "restart": Action.ENGINE_RESTART,
}
# Fields of a spec only the machine's owner may set, and why.
OWNER_FIELDS: dict[str, str] = {
    "model": "the model's source",
    "python": "the executable the worker runs",
    "vllm": "the executable the worker runs",
    "host": "the network the engine listens on",
    "api_key_env": "which secret the engine gets",
    "hf_token_env": "which secret the engine gets",
    "allow_unsafe": "it steps outside the allowlists",
}


def stored_spec(store: Engine, name: str) -> EngineSpec | None:
    """The saved spec of `name`, None when there is none."""
    try:
        data, _ = q.get_engine_spec(store, name)
    except NotFound:
        return None
    return parse_spec(data)


def configure_engine(
    store: Engine,
    actor: Actor,
    data: Mapping[str, Any],
    data_dir: Path,
    allow_unsafe: bool = False,
) -> EngineSpec:
    """Create or replace the spec `data` names, as `actor`. From a browser only within the
    allowlists and leaving the owner's settings as they are; `allow_unsafe` (outside the
    allowlists) only for the machine's owner. Saved, never started: a change takes effect
    when someone starts or restarts the engine."""
    name = str(data.get("name") or "")
    params = dict(data) | {"allow_unsafe": allow_unsafe}
    with guarded(store, actor, Action.ENGINE_CONFIGURE, name, params):
        if allow_unsafe and not actor.owns_machine:
            raise Forbidden(
                "allow_unsafe: stepping outside the allowlists is for the machine's owner, "
                "from the CLI (kvscope engine configure --allow-unsafe), never from a browser"
            )
        fields = dict(data)
        if actor.owns_machine:
            fields["allow_unsafe"] = allow_unsafe
        else:
            fields = _as_browser_may(store, name, fields)
        spec = parse_spec(fields)
        outside = outside_data_dir(spec.env, data_dir)
        if outside:
            raise InvalidInput("engine spec refused: " + "; ".join(outside))
        q.save_engine_spec(store, spec.name, spec.model_dump())
        return spec


def _as_browser_may(store: Engine, name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` if a browser may save them over the stored spec: every setting of the
    owner's left as it is (missing fields are kept); Forbidden naming each one added,
    removed or changed, and why."""
    stored = stored_spec(store, name)
    if stored is None:
        raise Forbidden(
            f"there is no engine {name!r}: a new engine names its model and executable, "
            "which the machine's owner does from the CLI (kvscope engine configure)"
        )
    before = stored.model_dump()
    fields = {k: before[k] for k in OWNER_FIELDS} | fields
    refused = [
        f"{k}: {why}; {OWNER_ONLY}" for k, why in OWNER_FIELDS.items() if fields[k] != before[k]
    ]
    env, args = fields.get("env") or {}, fields.get("extra_args") or []
    if isinstance(env, Mapping) and isinstance(args, list):  # else the model says what is wrong
        now = owner_items({str(k): str(v) for k, v in env.items()}, [str(a) for a in args])
        then = stored.owner_items
        for item in sorted(set(now) | set(then), key=lambda k: (k not in now, k)):
            new, old = now.get(item), then.get(item)
            if new != old:
                owned = new or old
                assert owned is not None
                how = "adding" if old is None else "removing" if new is None else "changing"
                what = owned.text if new else item
                refused.append(f"{what}: {owned.why}; {how} it: {OWNER_ONLY}")
    if refused:
        raise Forbidden("engine spec refused: " + "; ".join(refused))
    return fields


def request_engine(
    store: Engine, actor: Actor, verb: Verb, name: str, confirm: str | None = None
) -> RunRow:
    """Ask the worker to start, stop or restart engine `name`, as `actor`. A start or restart
    runs the spec saved now (carried in the request); from a browser, stop and restart need
    the engine's name typed in `confirm`."""
    with guarded(store, actor, ACTIONS[verb], name, {"confirm": confirm}):
        saved, _ = q.get_engine_spec(store, name)  # NotFound with the known names
        if verb != "start" and actor.origin is Origin.CONSOLE and (confirm or "").strip() != name:
            raise InvalidInput(
                f"{verb} interrupts every request engine {name} serves: type the engine's "
                f"name ({name}) to confirm"
            )
        params: dict[str, Any] = {"name": name}
        if verb != "stop":  # a stop needs no valid spec: it must work whatever is saved
            params["spec"] = parse_spec(saved).model_dump()
        return q.request_run(store, f"engine_{verb}", params, requested_by=str(actor))


def start_engine(store: Engine, actor: Actor, name: str) -> RunRow:
    """Ask the worker to start `name` with its saved spec."""
    return request_engine(store, actor, "start", name)


def stop_engine(store: Engine, actor: Actor, name: str, confirm: str | None = None) -> RunRow:
    """Ask the worker to stop `name`; it stays stopped until started again."""
    return request_engine(store, actor, "stop", name, confirm)


def restart_engine(store: Engine, actor: Actor, name: str, confirm: str | None = None) -> RunRow:
    """Ask the worker to stop `name` and start its saved spec."""
    return request_engine(store, actor, "restart", name, confirm)


def keep_running(store: Engine, actor: Actor, name: str) -> EngineSpec:
    """Want `name` running with its saved spec from now on, without waiting for a worker:
    the next worker starts it (or adopts it when it already runs that spec) and restarts it
    after a crash. What `kvscope up` does before it starts the worker."""
    with guarded(store, actor, Action.ENGINE_START, name, {"at": "worker start"}):
        spec = stored_spec(store, name)
        if spec is None:
            raise NotFound(f"no engine spec named {name!r}")
        q.mark_started(store, name, spec.model_dump())
        return spec
