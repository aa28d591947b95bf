"""Engine spec: what a managed vLLM engine is, rendered to the exact `vllm serve` argv and env.

Static mistakes (a CPU block size that is not a multiple of 32, a utilisation above 1) are
refused by the pydantic model; facts of this machine (the port is taken, the model folder
has no config.json, the executable is missing, FP8 KV without AVX-512) by `preflight()`,
before anything starts.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from planner.errors import EngineError, InvalidInput, NotFound, validation_message
from probes.engine.venv.tinymodel import TinyParams, command, is_complete
from probes.vllm.client import Target
from storage.outbound import LOOPBACK_ONLY, Allowlist
from storage.schemas import NAME_RE, TargetRow
from storage.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

ENTRY = Path(__file__).resolve().parent / "venv" / "vllm_entry.py"
CPU_BLOCK_MULTIPLE = 32
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KvDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
KV_DTYPES: tuple[str, ...] = get_args(KvDtype)
DTYPES: tuple[str, ...] = get_args(Dtype)


class EngineSpec(BaseModel):
    """Everything `vllm serve` needs; stored per engine name in `engine_specs`."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field("embedded", description="also the target name the engine is scraped as")
    model: str = Field(description="model directory (or a hub name on a machine that has it)")
    served_model_name: str | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1024, le=65535)
    dtype: Dtype = "auto"
    max_model_len: int | None = Field(None, ge=16)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=16)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    kv_cache_dtype: KvDtype = "auto"
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    kv_cache_memory_bytes: int | None = Field(None, ge=1 << 20)
    block_size: int | None = Field(None, ge=1)
    num_gpu_blocks_override: int | None = Field(None, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    enforce_eager: bool = False
    python: str | None = Field(None, description="the engine venv's python: runs vllm_entry.py")
    vllm: str | None = Field(None, description="a `vllm` executable, instead of `python`")
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("name must be letters, digits, '.', '_' or '-' (at most 100)")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not ENV_NAME_RE.fullmatch(k)]
        if bad:
            raise ValueError(
                f"environment variable name {bad[0]!r} is not valid "
                "(letters, digits and '_', not starting with a digit)"
            )
        return v

    @model_validator(mode="after")
    def _combinations(self) -> EngineSpec:
        if self.device == "cpu":
            if self.block_size is not None and self.block_size % CPU_BLOCK_MULTIPLE:
                raise ValueError(
                    f"block_size {self.block_size} does not work on CPU: vLLM's CPU attention "
                    f"needs a multiple of {CPU_BLOCK_MULTIPLE} (try "
                    f"{max(CPU_BLOCK_MULTIPLE, self.block_size // 32 * 32)})"
                )
            if self.kv_cache_memory_bytes is None:
                raise ValueError(
                    "a CPU engine needs kv_cache_memory_bytes: without it vLLM tries "
                    "to reserve 92% of memory and refuses to start"
                )
            if self.tensor_parallel_size != 1:
                raise ValueError("tensor_parallel_size must be 1 on CPU")
        if self.python and self.vllm:
            raise ValueError("give either python (the engine venv's) or vllm, not both")
        if not (self.python or self.vllm):
            raise ValueError("name the engine's python (its venv) or a vllm executable")
        return self

    @property
    def api_key(self) -> str | None:
        """The key the engine demands on its /v1 routes (`--api-key` or `VLLM_API_KEY`)."""
        args = self.extra_args
        for i, arg in enumerate(args):
            if arg == "--api-key" and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith("--api-key="):
                return arg.split("=", 1)[1]
        return self.env.get("VLLM_API_KEY") or None

    @property
    def target(self) -> Target:
        """Where the engine answers, with the key it wants; the address it listens on is
        this machine's, so it is allowed (link-local and metadata still never are)."""
        return Target(self.base_url, self.api_key, LOOPBACK_ONLY.plus(self.host))

    @property
    def served_name(self) -> str:
        """The model name clients use."""
        return self.served_model_name or Path(self.model).name

    @property
    def base_url(self) -> str:
        """Where the engine listens."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def argv(self) -> list[str]:
        """The exact command line that starts the engine."""
        head = [self.vllm, "serve"] if self.vllm else [str(self.python), str(ENTRY), "serve"]
        args = [
            *head,
            self.model,
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
        ]
        for flag, value in (
            ("--max-model-len", self.max_model_len),
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
            ("--gpu-memory-utilization", self.gpu_memory_utilization),
            ("--kv-cache-memory-bytes", self.kv_cache_memory_bytes),
            ("--block-size", self.block_size),
            ("--num-gpu-blocks-override", self.num_gpu_blocks_override),
        ):
            if value is not None:
                args += [flag, str(value)]
        if self.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.tensor_parallel_size != 1:
            args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        for flag, on in (
            ("chunked-prefill", self.enable_chunked_prefill),
            ("prefix-caching", self.enable_prefix_caching),
        ):
            if on is not None:
                args.append(f"--enable-{flag}" if on else f"--no-enable-{flag}")
        if self.enforce_eager:
            args.append("--enforce-eager")
        return [*args, *self.extra_args]

    def environment(self, run_dir: Path) -> dict[str, str]:
        """Variables added to the worker's environment; caches and temp files stay in run_dir."""
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(run_dir.parent / "vllm-cache"),
            "TMPDIR": str(engine_tmp_dir(run_dir)),
            "PYTHONUNBUFFERED": "1",
        }
        if self.device == "cpu":
            env["VLLM_TARGET_DEVICE"] = "cpu"
        return {**env, **self.env}

    def command_line(self, run_dir: Path) -> str:
        """A copyable shell line: environment, then argv."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.environment(run_dir).items())
        return f"env {env} {shlex.join(self.argv())}"


# vLLM binds ZeroMQ sockets at TMPDIR/<uuid4>; a Unix socket path holds at most 107 bytes.
_IPC_ROOM = 107 - len("/") - 36


def engine_tmp_dir(run_dir: Path) -> Path:
    """The engine's TMPDIR: inside its run folder, or a short folder of kvscope's own in the
    system temp when that path is too long for vLLM's Unix sockets."""
    inside = run_dir / "tmp"
    if len(str(inside)) <= _IPC_ROOM:
        return inside
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"kvscope-{digest}"


def parse_spec(data: dict[str, object]) -> EngineSpec:
    """Validate a spec from a form, a file or the store; InvalidInput with one line per field."""
    try:
        return EngineSpec.model_validate(data)
    except ValidationError as err:
        raise InvalidInput(f"engine spec refused: {validation_message(err)}") from err


def parse_env_items(items: list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """`KEY=VALUE` items applied over `env`; `KEY=` removes KEY. InvalidInput names a bad item."""
    out = dict(env or {})
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not ENV_NAME_RE.fullmatch(key):
            raise InvalidInput(
                f"environment item {item!r} is not KEY=VALUE with a valid variable name"
            )
        if value:
            out[key] = value
        else:
            out.pop(key, None)
    return out


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1" if host in ("0.0.0.0", "") else host, port)) == 0


def cpu_has_avx512() -> bool:
    """FP8 KV cache on CPU needs AVX-512 (or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512f" in flags or "amx_tile" in flags


def preflight(spec: EngineSpec, check_port: bool = True) -> list[str]:
    """What stops this spec from starting on this machine; empty when it may start."""
    problems = []
    exe = spec.vllm or spec.python or ""
    if not (Path(exe).is_file() and os.access(exe, os.X_OK)):
        which = "vllm executable" if spec.vllm else "engine python"
        problems.append(
            f"the {which} {exe!r} does not exist or is not executable"
            + ("; run `make engine-env` to build the engine's venv" if spec.python else "")
        )
    model = Path(spec.model)
    if model.is_absolute() or spec.model.startswith("."):
        if not model.is_dir():
            problems.append(
                f"model directory {spec.model} does not exist"
                + ("; run `kvscope model build-tiny`" if "tiny" in spec.model else "")
            )
        elif not (model / "config.json").is_file():
            problems.append(f"model directory {spec.model} has no config.json")
    if check_port and port_in_use(spec.host, spec.port):
        problems.append(
            f"port {spec.port} on {spec.host} is already in use; pick another port "
            "or stop what listens there"
        )
    if spec.device == "cpu" and spec.kv_cache_dtype.startswith("fp8") and not cpu_has_avx512():
        problems.append("FP8 KV cache on CPU needs AVX-512 or AMX, which this CPU lacks")
    return problems


def embedded_spec(settings: Settings) -> EngineSpec:
    """The default managed engine: real vLLM on CPU serving the tiny local Llama.

    The KV space is small on purpose (16 MiB = 16,384 float32 tokens of the tiny model), so a
    few concurrent long requests fill it and the probes can find its limits.

    One engine process instead of two (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so vLLM runs the
    model inside its engine-core process): with a separate model worker the engine core
    busy-polls for the worker's results, and on a 2-core machine that starves the API server,
    which then answers metrics scrapes only between requests and streams tokens in bursts.
    """
    return EngineSpec(
        name="embedded",
        model=str(settings.data_dir / "models" / "tiny-llama"),
        served_model_name="tiny-llama",
        device="cpu",
        port=settings.embedded_port,
        dtype="float32",
        max_model_len=8192,
        kv_cache_memory_bytes=settings.embedded_kv_bytes,
        block_size=32,
        enforce_eager=True,
        python=str(settings.engine_venv / "bin" / "python"),
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )


def build_tiny_model(
    settings: Settings, out: Path | None = None, params: TinyParams | None = None
) -> Path:
    """Build (once) the tiny model with the engine venv's python; returns its folder."""
    folder = out or settings.data_dir / "models" / "tiny-llama"
    params = (params or TinyParams()).resolved()
    if is_complete(folder, params):
        return folder
    python = settings.engine_venv / "bin" / "python"
    if not python.exists():
        raise EngineError(
            f"the engine venv {settings.engine_venv} does not exist; run `make engine-env` first"
        )
    res = subprocess.run(
        command(python, folder, params), capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise EngineError(f"building the tiny model failed: {res.stderr.strip()[-500:]}")
    return folder


def address(store: Engine, target: TargetRow, allow: Allowlist) -> Target:
    """Where a stored target answers and with which token: a managed engine's key is in its
    spec, an attached engine's in the variable the target names (read now). Requests go
    only where `allow` (the store's allowlist, `q.allowlist`) lets them."""
    from storage import queries as q  # the store's query layer, only when asked

    if target.managed:
        try:
            return parse_spec(q.get_engine_spec(store, target.name)[0]).target
        except NotFound:
            pass  # a managed target whose spec was removed: its URL, no key
    return Target.resolve(target.base_url, target.token_env, allow=allow)
