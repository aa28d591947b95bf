"""Engine page: the managed vLLM engine's spec, command, lifecycle, log, and what it allocated.

Start, stop and restart are requests the worker carries out (an operator's; stop and restart
need the engine's name typed); the page shows their progress. The form edits a stored spec
within the allowlists (an admin's); what only the machine's owner sets is shown, not edited.
A saved change applies at the next start or restart; the page says when the saved spec is
not what runs. Secrets are masked. The KV facts vLLM logged at startup stand beside the
planner's prediction for the same spec.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from app import common
from planner.errors import KvscopeError
from planner.kv import vllm_kv_cache
from planner.models import from_config_file
from probes.engine import changes
from probes.engine.allowlists import anyones_part, owners_part
from probes.engine.spec import (
    DTYPES,
    KV_DTYPES,
    EngineSpec,
    mask_command,
    parse_env_items,
    parse_spec,
    spec_differences,
)
from storage import dashboards, queries
from storage.access import Action, allowed, mask


def render() -> None:
    """Draw the page."""
    st.title("Engine")
    common.worker_banner()
    store = common.store()
    specs = queries.list_engine_specs(store)
    if not specs:
        st.info(
            "No managed engine yet. `make run` (or `kvscope up`) creates the embedded CPU "
            "engine; `kvscope engine configure NAME --model PATH ...` any other."
        )
        return
    names = [n for n, _, _ in specs]
    name = st.selectbox("Engine", names, key="engine_name") if len(names) > 1 else names[0]
    _status(name)
    view = dashboards.engine_view(store, name)
    try:
        spec = parse_spec(view.spec)
    except KvscopeError as err:
        st.error(f"The stored spec is invalid: {mask(str(err))}")
        return
    _facts(spec, view)
    st.subheader("Command")
    st.caption(
        "Exactly what the worker runs for the saved spec (environment, then argv; a secret "
        "as a reference to the variable it is read from); copy it to run the engine by hand."
    )
    run_dir = common.settings().data_dir / "engines" / name
    st.code(mask_command(spec.command_line(run_dir)), language="bash", wrap_lines=True)
    _owners(spec)
    _form(spec)


@st.fragment(run_every=2.0)
@common.error_boundary
def _status(name: str) -> None:
    view = dashboards.engine_view(common.store(), name)
    state = view.state
    status = str(state.get("status", "?"))
    up = (
        time.time() - state["healthy_at"]
        if state.get("healthy_at") and status == "running"
        else None
    )
    c = st.columns(4)
    c[0].metric("Status", status, help="stopped, starting, running, stopping, crashed, failed")
    c[1].metric(
        "Uptime",
        f"{up / 60:.1f} min" if up else "-",
        help="since /health first answered after the last start",
    )
    c[2].metric("Restarts", state.get("restarts", 0), help="crash restarts and requested ones")
    c[3].metric(
        "Wanted",
        view.desired,
        help="the worker restarts a crashed engine only while it is wanted running",
    )
    if state.get("message"):
        (st.error if status in ("crashed", "failed") else st.caption)(
            common.md_text(mask(state["message"]))
        )
    _applies(view, status)
    who = common.actor()
    can = allowed(who, Action.ENGINE_START)
    b = st.columns([1, 1, 1, 3])
    typed = b[3].text_input(
        f"Type the engine's name ({name}) to stop or restart",
        key=f"confirm_{name}",
        help="stop and restart interrupt every request in flight",
        disabled=not can,
    )
    buttons: tuple[tuple[Any, str, changes.Verb, bool], ...] = (
        (b[0], "Start", "start", False),
        (b[1], "Stop", "stop", True),
        (b[2], "Restart", "restart", True),
    )
    for col, label, verb, needs in buttons:
        if col.button(
            label,
            key=f"engine_{verb}_{name}",
            disabled=not can or (needs and typed.strip() != name),
            help=None if can else "starting, stopping and restarting need an operator",
        ):
            try:
                run = changes.request_engine(common.store(), who, verb, name, typed)
            except KvscopeError as err:
                st.error(str(err))
            else:
                st.session_state["engine_run"] = run.id
    _request_result()
    with st.expander("Log (last lines)", expanded=status in ("crashed", "failed", "starting")):
        lines = [mask(line) for line in view.log_lines[-80:]]
        st.code("\n".join(lines) or "(no output yet)", language="log")


def _applies(view: dashboards.EngineView, status: str) -> None:
    """Whether the saved spec is what runs: supervision restarts the spec as last started."""
    if view.started_spec is None:
        st.caption("Never started on request: Start runs the saved spec.")
        return
    differences = spec_differences(view.started_spec, view.spec)
    if not differences:
        return
    what = "runs" if status in ("starting", "running", "crashed", "stopping") else "last ran"
    st.warning(
        f"The saved spec differs from the one the engine {what} (as last started): "
        + "; ".join(differences)
        + ". It applies when someone starts or restarts the engine; a crash restart runs "
        "the spec as last started."
    )


def _request_result() -> None:
    run_id = st.session_state.get("engine_run")
    if not run_id:
        return
    run = common.run(common.db_url(), run_id)
    verb = run.kind.removeprefix("engine_")
    if run.status in ("queued", "running"):
        st.info(f"{verb}: {run.status}… (the worker carries this out)")
    elif run.status == "done":
        st.success(f"{verb}: done")
    else:
        st.error(f"{verb} failed: {common.md_text(run.error)}")


def _prediction(spec: EngineSpec) -> dict[str, Any] | None:
    """The planner's numbers for this spec, when the spec fixes the KV bytes."""
    config = Path(spec.model) / "config.json"
    if spec.kv_cache_memory_bytes is None or not config.is_file():
        return None
    layout = vllm_kv_cache(
        from_config_file(config),
        spec.kv_cache_memory_bytes,
        spec.block_size,
        kv_dtype=spec.kv_cache_dtype,
        model_dtype=spec.dtype,
        max_model_len=spec.max_model_len,
    )
    blocks = spec.num_gpu_blocks_override or layout.num_blocks
    return {
        "blocks": blocks,
        "tokens": layout.logged_tokens if blocks == layout.num_blocks else None,
        "concurrency": round(layout.max_concurrency, 2),
        "block_size": layout.block_size,
        "kv_dtype": layout.kv_dtype,
    }


def _facts(spec: EngineSpec, view: dashboards.EngineView) -> None:
    st.subheader("KV cache: what vLLM allocated, what the planner predicts")
    facts = view.state.get("facts", {})
    target = view.target or {}
    try:
        pred = _prediction(spec)
    except KvscopeError as err:
        pred = None
        st.caption(f"No prediction: {err}")
    rows = [
        (
            "KV blocks",
            target.get("num_gpu_blocks"),
            pred and pred["blocks"],
            "vllm:cache_config_info num_gpu_blocks vs KV bytes // (page bytes x layers)",
        ),
        (
            "KV capacity (tokens, as logged)",
            (facts.get("kv_capacity") or {}).get("tokens"),
            pred and pred["tokens"],
            "'KV cache size: N tokens' log line vs concurrency x max len",
        ),
        (
            "Max concurrency at max length",
            (facts.get("max_concurrency") or {}).get("concurrency"),
            pred and pred["concurrency"],
            "'Maximum concurrency' log line vs blocks / blocks per max-length request",
        ),
        (
            "Block size",
            target.get("block_size"),
            pred and pred["block_size"],
            "tokens per KV block",
        ),
    ]
    st.dataframe(
        pd.DataFrame(rows, columns=["", "vLLM reported", "planner", "where from"]),
        hide_index=True,
        width="stretch",
    )
    if pred is None:
        st.caption(
            "The planner predicts exactly when the spec fixes the KV bytes "
            "(kv_cache_memory_bytes) and the model folder has a config.json; for GPU "
            "utilisation budgets use the Planner page."
        )


def _owners(spec: EngineSpec) -> None:
    """What only the machine's owner sets (from the CLI), shown but not editable here."""
    st.subheader("Set by the machine's owner")
    env, args = owners_part(spec.env, spec.extra_args)
    rows = [
        ("Model", spec.model),
        ("Executable", spec.vllm or spec.python or "-"),
        ("Listens on", spec.host),
        ("API key from", f"${spec.api_key_env}" if spec.api_key_env else "- (no key)"),
        ("Hugging Face token from", f"${spec.hf_token_env}" if spec.hf_token_env else "-"),
        ("Owner's flags", mask_command(" ".join(args)) if args else "-"),
        ("Owner's variables", mask_command(" ".join(f"{k}={v}" for k, v in env.items())) or "-"),
    ]
    st.dataframe(pd.DataFrame(rows, columns=["", "value"]), hide_index=True, width="stretch")
    st.caption(
        "Changed only from the CLI (`kvscope engine configure`), never from a browser; "
        "secrets are read from the named variables when the engine starts and never stored."
    )
    if spec.allow_unsafe:
        st.warning(
            "Outside the allowlists, set by the machine's owner with --allow-unsafe: "
            + ("; ".join(spec.unsafe_items) or "nothing at the moment")
        )


def _form(spec: EngineSpec) -> None:
    st.subheader("Spec")
    who = common.actor()
    can = allowed(who, Action.ENGINE_CONFIGURE)
    own_env, own_args = anyones_part(spec.env, spec.extra_args)
    with st.form("engine_spec"):
        top = st.columns(2)
        served = top[0].text_input("Served model name", spec.served_model_name or "")
        device = top[1].selectbox(
            "Device", ["cpu", "cuda"], index=["cpu", "cuda"].index(spec.device)
        )
        c = st.columns(3)
        port = c[0].number_input("Port", 1024, 65535, spec.port)
        dtype = c[1].selectbox("dtype", DTYPES, index=DTYPES.index(spec.dtype))
        kv_dtype = c[2].selectbox(
            "KV cache dtype", KV_DTYPES, index=KV_DTYPES.index(spec.kv_cache_dtype)
        )
        c = st.columns(3)
        max_len = c[0].number_input(
            "Max model length (0 = model's)", 0, 10_000_000, spec.max_model_len or 0
        )
        kv_mib = c[1].number_input(
            "KV space MiB (0 = use GPU utilisation)",
            0,
            10_000_000,
            (spec.kv_cache_memory_bytes or 0) // (1 << 20),
            help="kv_cache_memory_bytes; required on CPU",
        )
        block = c[2].number_input(
            "Block size (0 = default)",
            0,
            1024,
            spec.block_size or 0,
            help="a multiple of 32 on CPU",
        )
        c = st.columns(3)
        util = c[0].number_input(
            "GPU memory utilisation (0 = vLLM default)",
            0.0,
            1.0,
            spec.gpu_memory_utilization or 0.0,
        )
        seqs = c[1].number_input(
            "Max running sequences (0 = default)", 0, 100_000, spec.max_num_seqs or 0
        )
        override = c[2].number_input(
            "Override KV blocks (0 = off)", 0, 10_000_000, spec.num_gpu_blocks_override or 0
        )
        eager = st.checkbox("Enforce eager (faster start, no CUDA graphs)", spec.enforce_eager)
        extra = st.text_input(
            "Extra arguments",
            shlex.join(own_args),
            help="known vllm serve flags with typed values, e.g. --seed 1 --async-scheduling "
            "(the list: docs/engine.md)",
        )
        env_text = st.text_input(
            "Environment",
            " ".join(f"{k}={shlex.quote(v)}" for k, v in own_env.items()),
            help="KEY=VALUE items from the allowlist (VLLM_CPU_*, OMP_*, CUDA_VISIBLE_DEVICES, "
            "cache folders under the data directory; docs/engine.md). The CPU default sets "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0: one engine process, so that on a small machine "
            "the API server is not starved (see docs/probes.md).",
        )
        if st.form_submit_button(
            "Save spec",
            disabled=not can,
            help=None if can else "configuring an engine needs an admin",
        ):
            try:
                env = parse_env_items(shlex.split(env_text))
                args = shlex.split(extra)
            except (KvscopeError, ValueError) as err:
                st.error(f"environment or arguments: {err}")
                return
            keep_env, keep_args = owners_part(spec.env, spec.extra_args)
            data = spec.model_dump() | {
                "served_model_name": served or None,
                "device": device,
                "port": int(port),
                "dtype": dtype,
                "kv_cache_dtype": kv_dtype,
                "max_model_len": int(max_len) or None,
                "kv_cache_memory_bytes": int(kv_mib) * (1 << 20) or None,
                "block_size": int(block) or None,
                "gpu_memory_utilization": util or None,
                "max_num_seqs": int(seqs) or None,
                "num_gpu_blocks_override": int(override) or None,
                "enforce_eager": eager,
                "extra_args": [*args, *keep_args],
                "env": keep_env | env,  # a typed owner's variable is a change: refused
            }
            try:
                changes.configure_engine(common.store(), who, data, common.settings().data_dir)
            except KvscopeError as err:
                st.error(str(err))
            else:
                # Rerun so the form is drawn from what was saved: widgets drawn from the old
                # values would lose a second edit made right away.
                st.session_state["engine_saved"] = (
                    "Saved. It applies when someone starts or restarts the engine."
                )
                st.rerun()
    if saved := st.session_state.pop("engine_saved", None):
        st.success(saved)
