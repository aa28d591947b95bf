"""Engine spec: what a managed vLLM engine is, rendered to the exact `vllm serve` argv and env.

Static mistakes (a CPU block size that is not a multiple of 32, a utilisation above 1, an
environment variable or a flag off the allowlists of `allowlists.py`, a secret given as a
value) are refused by the pydantic model; facts of this machine (the port is taken, the
model folder has no config.json, the executable is missing, FP8 KV without AVX-512, a
secret's variable unset) by `preflight()`, before anything starts. Secrets are named, never
held: the API key and the Hugging Face token are read from `KVSCOPE_TOKEN_*` variables when
the engine is spawned.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from planner.errors import EngineError, InvalidInput, NotFound, validation_message
from planner.kv import vllm_kv_cache
from planner.models import from_config_file
from planner.simulate.engine import EngineConfig
from probes.engine.allowlists import (
    ENV_NAME_RE,
    TOKEN_ENV_RE,
    TOKEN_PREFIX,
    Owned,
    arg_refusals,
    env_refusals,
    not_allowed,
    outside_data_dir,
    owner_items,
)
from probes.engine.venv.tinymodel import TinyParams, command, is_complete
from probes.vllm.client import Target
from probes.vllm.logparse import read_startup
from storage.access.audit import MASK, is_secret_key, mask
from storage.outbound import LOOPBACK_ONLY, Allowlist
from storage.schemas import NAME_RE, TargetRow
from storage.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

ENTRY = Path(__file__).resolve().parent / "venv" / "vllm_entry.py"
CPU_BLOCK_MULTIPLE = 32
# The variables the engine reads its secrets from, by the spec field that names the source.
SECRET_VARIABLES = {"api_key_env": "VLLM_API_KEY", "hf_token_env": "HF_TOKEN"}
KvDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
KV_DTYPES: tuple[str, ...] = get_args(KvDtype)
DTYPES: tuple[str, ...] = get_args(Dtype)


class EngineSpec(BaseModel):
    """Everything `vllm serve` needs; stored per engine name in `engine_specs`."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field("embedded", description="also the target name the engine is scraped as")
    model: str = Field(
        description="model directory (or a hub name on a machine that has it); the owner's"
    )
    served_model_name: str | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    host: str = Field("127.0.0.1", description="where the engine listens; the owner's")
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
    extra_args: list[str] = Field(
        default_factory=list, description="known vllm serve flags with typed values"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="variables from the allowlist (docs/engine.md)"
    )
    api_key_env: str | None = Field(
        None,
        description=f"the {TOKEN_PREFIX}* variable holding the key the engine demands "
        "(its VLLM_API_KEY), read when the engine is spawned; the owner's",
    )
    hf_token_env: str | None = Field(
        None,
        description=f"the {TOKEN_PREFIX}* variable holding a Hugging Face token (its HF_TOKEN), "
        "read when the engine is spawned; the owner's",
    )
    allow_unsafe: bool = Field(
        False,
        description="the machine's owner stepped outside the allowlists "
        "(kvscope engine configure --allow-unsafe)",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("name must be letters, digits, '.', '_' or '-' (at most 100)")
        return v

    @field_validator("model", "served_model_name", "host", "python", "vllm")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        # A value that starts with '-' would be read by vllm serve as another flag.
        if v is not None and (not v or v.startswith("-") or "\0" in v or "\n" in v):
            raise ValueError(f"{v!r} must be non-empty, one line, not starting with '-'")
        return v

    @field_validator("api_key_env", "hf_token_env", mode="before")
    @classmethod
    def _token_env(cls, v: object) -> object:
        if v in (None, ""):
            return None
        if not isinstance(v, str) or not TOKEN_ENV_RE.match(v):
            raise ValueError(
                f"{v!r} must name a variable {TOKEN_PREFIX}… (capitals, digits, '_') set in "
                "the worker's environment: the secret itself is never stored"
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
        refused = not_allowed(
            [*env_refusals(self.env), *arg_refusals(self.extra_args)],
            owner=True,  # who sets what is the guarded action's to check; here: what is valid
            allow_unsafe=self.allow_unsafe,
        )
        if refused:
            raise ValueError("; ".join(refused))
        return self

    @property
    def owner_items(self) -> dict[str, Owned]:
        """Variables and flags only the machine's owner may set, by name (what a browser
        sees and cannot change)."""
        return owner_items(self.env, self.extra_args)

    @property
    def unsafe_items(self) -> list[str]:
        """What the owner set outside the allowlists (`--allow-unsafe`), masked, with why."""
        return [f"{mask_command(o.text)} ({o.why})" for o in self.owner_items.values() if o.unsafe]

    def secret_environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The engine's secrets, read from the variables the spec names (at spawn only)."""
        missing = self.missing_secrets(environ)
        if missing:
            raise EngineError(f"engine {self.name} not started: " + "; ".join(missing))
        return {
            SECRET_VARIABLES[field]: environ[source]
            for field, source in self._secret_sources().items()
        }

    def missing_secrets(self, environ: Mapping[str, str]) -> list[str]:
        """Secret variables the spec names that `environ` lacks."""
        return [
            f"{field} names ${source}, which is not set in the worker's environment "
            f"(the engine's {SECRET_VARIABLES[field]} comes from it)"
            for field, source in self._secret_sources().items()
            if not environ.get(source)
        ]

    def _secret_sources(self) -> dict[str, str]:
        return {
            field: source
            for field in SECRET_VARIABLES
            if (source := getattr(self, field)) is not None
        }

    @property
    def target(self) -> Target:
        """Where the engine answers, with the key it wants (read now from the variable the
        spec names; no key when that variable is unset). The address it listens on is this
        machine's, so it is allowed (link-local and metadata still never are)."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return Target(self.base_url, key or None, LOOPBACK_ONLY.plus(self.host))

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
        """Variables added to the worker's environment; caches and temp files stay in run_dir.
        Never a secret: those are added at spawn (`secret_environment`)."""
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
            threads = cpu_threads()
            if not threads.keys() & self.env.keys():  # a spec's own pair is kept whole
                env |= threads
        return {**env, **self.env}

    def command_line(self, run_dir: Path) -> str:
        """A copyable shell line: environment (secrets as a reference to their variable, which
        the shell expands), then argv."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.environment(run_dir).items()]
        env += [
            f'{SECRET_VARIABLES[field]}="${source}"'
            for field, source in self._secret_sources().items()
        ]
        return f"env {' '.join(env)} {shlex.join(self.argv())}"


def cpu_threads() -> dict[str, str]:
    """OpenMP settings for a CPU engine whose spec names none: one thread per core but one,
    unpinned. vLLM's default pins a thread to every core, and each layer waits at a barrier
    for all of them, so a core wanted by anything else (its own API server, the worker's
    load generator, a neighbour) stalls every step. On 2 cores beside one busy process, the
    suite's batch sweep took 264-342 s that way and 26 s with one free thread."""
    cores = len(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(max(1, cores - 1))}


def mask_command(text: str) -> str:
    """A command line (or argument words) with every secret masked: the value of a `KEY=value`
    word whose KEY looks secret, the value after a secret-looking flag, bearer tokens. A
    reference to a variable (`VLLM_API_KEY="$KVSCOPE_TOKEN_X"`) holds no secret and stays."""
    try:
        words = shlex.split(text)
    except ValueError:
        return str(mask(text))
    out = []
    for word in mask(words):
        key, eq, value = str(word).partition("=")
        if eq and not key.startswith("-") and is_secret_key(key):
            if value.startswith("$") and TOKEN_ENV_RE.match(value[1:]):
                out.append(f'{key}="{value}"')
                continue
            word = f"{key}={MASK}"
        out.append(shlex.quote(str(word)))
    return " ".join(out)


def spec_differences(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """`field: old → new` for each field two stored specs differ in, secrets masked."""
    masked_before, masked_after = mask(dict(before)), mask(dict(after))
    return [
        f"{k}: {masked_before.get(k)!r} → {masked_after.get(k)!r}"
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    ]


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


def preflight(
    spec: EngineSpec,
    check_port: bool = True,
    environ: Mapping[str, str] | None = None,
    data_dir: Path | None = None,
) -> list[str]:
    """What stops this spec from starting on this machine; empty when it may start.
    `environ` is where the secrets come from (the worker's environment by default)."""
    problems = spec.missing_secrets(os.environ if environ is None else environ)
    if data_dir is not None:
        problems += outside_data_dir(spec.env, data_dir)
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

    Its scheduling limits are vLLM 0.32's own defaults on CPU (128 sequences, 2,048 tokens a
    step), written out because its startup log does not state them and the simulator's
    calibration reads them from the spec.
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
        max_num_seqs=128,
        max_num_batched_tokens=2048,
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


def running_spec(store: Engine, name: str) -> EngineSpec:
    """A managed engine's spec as last started, which is what runs (a saved edit waits for
    a restart), or as saved where it never was; NotFound without a spec of that name."""
    from storage import queries as q  # the store's query layer, only when asked

    return parse_spec(q.get_started_spec(store, name) or q.get_engine_spec(store, name)[0])


def address(store: Engine, target: TargetRow, allow: Allowlist) -> Target:
    """Where a stored target answers and with which token, read now from the variable named:
    a managed engine's spec (as last started, which is what runs) names its key's variable,
    an attached target its token's. Requests to an attached target go only where `allow`
    (the store's allowlist, `q.allowlist`) lets them."""
    if target.managed:
        try:
            spec = running_spec(store, target.name)
        except NotFound:
            pass  # a managed target whose spec was removed: its URL, no key
        else:
            return spec.target
    return Target.resolve(target.base_url, target.token_env, allow=allow)


def engine_config(spec: EngineSpec, data_dir: Path) -> EngineConfig:
    """The simulator's view of a managed engine: its KV blocks as the planner counts them
    from the spec (less vLLM's null block), and its scheduling limits from the spec or,
    where the spec leaves vLLM's defaults, from the engine's own startup log."""
    if not spec.kv_cache_memory_bytes and not spec.num_gpu_blocks_override:
        raise InvalidInput(
            f"engine {spec.name} has no explicit KV size (kv_cache_memory_bytes or "
            "num_gpu_blocks_override): the simulator cannot count its blocks"
        )
    layout = vllm_kv_cache(
        from_config_file(Path(spec.model) / "config.json"),
        spec.kv_cache_memory_bytes or 1,
        spec.block_size,
        kv_dtype=spec.kv_cache_dtype,
        model_dtype=spec.dtype,
        max_model_len=spec.max_model_len,
    )
    blocks = spec.num_gpu_blocks_override or layout.num_blocks
    log = data_dir / "engines" / spec.name / "engine.log"
    report = read_startup(log.read_text(errors="replace").splitlines()) if log.is_file() else None
    seqs = spec.max_num_seqs or (report.max_num_seqs if report else None)
    batched = spec.max_num_batched_tokens or (report.max_num_batched_tokens if report else None)
    if seqs is None or batched is None:
        raise InvalidInput(
            f"engine {spec.name}: max_num_seqs and max_num_batched_tokens are neither in its "
            "spec nor in its startup log; set them in the spec"
        )
    return EngineConfig(
        num_blocks=blocks - 1,
        block_size=layout.block_size,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        chunked_prefill=spec.enable_chunked_prefill is not False,
        prefix_caching=spec.enable_prefix_caching is not False,
        max_model_len=layout.max_model_len,
    )
