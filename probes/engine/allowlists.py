"""What an engine spec may put into the engine's environment and onto its command line, and
who may put it there. A form in a browser must not become code run as the worker's user, so
everything is refused unless a list here names it.

Environment variables come from an allowlist with typed values (vLLM's safe `VLLM_*`,
OpenMP's `OMP_*`, `CUDA_VISIBLE_DEVICES`, cache folders under the data directory). Extra
`vllm serve` arguments come from a list of known flags with typed values. Some flags only
the machine's owner may set (from the CLI: they name files, the model's own code or its
source); everything else (`LD_*`, `PYTHON*`, `BROWSER`, the offline defaults, unknown flags)
only the owner with `--allow-unsafe`. Secrets are never values: they are given by
reference (`api_key_env`, `hf_token_env`). docs/engine.md lists all of it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from storage.access.audit import is_secret_key
from storage.outbound import TOKEN_PREFIX as TOKEN_PREFIX  # one prefix for every token

# Who may set an item: anyone allowed to configure engines; only the machine's owner (the
# CLI); only the owner with --allow-unsafe; nobody (a malformed item, a secret, a flag that
# has a field of its own).
Who = Literal["anyone", "owner", "unsafe", "never"]
Kind = Literal["int", "float", "bool", "choice", "word", "path", "cache", "devices"]

TOKEN_ENV_RE = re.compile(rf"^{TOKEN_PREFIX}[A-Z0-9_]{{1,80}}$")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORD_RE = re.compile(r"^[A-Za-z0-9_.,:+/{}()@=-]{1,200}$")
_DEVICE = r"([0-9]+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-fA-F/-]+)"
_DEVICES_RE = re.compile(rf"^{_DEVICE}(,{_DEVICE})*$")
# Shapes of well-known tokens: never stored as a value, whatever their name.
_TOKEN_SHAPE = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
    r"github_pat_[A-Za-z0-9_]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[A-Z0-9]{16})\b"
)
SECRET_HINT = (
    "secrets are never stored: name a variable that holds it, set in the worker's "
    f"environment (--api-key-env / --hf-token-env {TOKEN_PREFIX}…)"
)
OWNER_ONLY = "only the machine's owner may set or change it, from the CLI, never from a browser"
UNSAFE_ONLY = "outside the allowlists: only the machine's owner, with --allow-unsafe"


@dataclass(frozen=True)
class Value:
    """The type of a variable's or a flag's value."""

    kind: Kind
    choices: tuple[str, ...] = ()
    minimum: float = 0

    def problem(self, text: str) -> str | None:
        """Why `text` is not a value of this type, or None."""
        if self.kind == "int":
            if not re.fullmatch(r"[0-9]{1,18}", text) or int(text) < self.minimum:
                return f"wants a whole number of at least {self.minimum:g}, not {text!r}"
        elif self.kind == "float":
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if not math.isfinite(number) or number < self.minimum:
                return f"wants a number of at least {self.minimum:g}, not {text!r}"
        elif self.kind == "bool":
            if text not in ("0", "1"):
                return f"wants 0 or 1, not {text!r}"
        elif self.kind == "choice":
            if text not in self.choices:
                return f"wants one of {', '.join(self.choices)}, not {text!r}"
        elif self.kind == "devices":
            if not _DEVICES_RE.match(text):
                return f"wants device numbers or GPU/MIG UUIDs separated by commas, not {text!r}"
        elif self.kind in ("path", "cache"):
            if not text.startswith("/") or ".." in Path(text).parts or "\0" in text:
                return f"wants an absolute path without '..', not {text!r}"
        elif not _WORD_RE.match(text) or text.startswith("-"):
            return f"wants letters, digits and . , : + / {{}} ( ) @ = _ -, not {text!r}"
        return None


_INT, _FLOAT, _BOOL, _WORD = Value("int"), Value("float"), Value("bool"), Value("word")
_CACHE = Value("cache")  # a folder under the data directory


def _choice(*names: str) -> Value:
    return Value("choice", names)


# -- environment ----------------------------------------------------------------------------

ENV: dict[str, Value] = {
    # vLLM (only variables that tune it; never ones that load code, open endpoints or
    # change where models come from)
    "VLLM_CPU_KVCACHE_SPACE": _INT,
    "VLLM_CPU_OMP_THREADS_BIND": _WORD,
    "VLLM_CPU_NUM_OF_RESERVED_CPU": _INT,
    "VLLM_CPU_MOE_PREPACK": _BOOL,
    "VLLM_ENABLE_V1_MULTIPROCESSING": _BOOL,
    "VLLM_WORKER_MULTIPROC_METHOD": _choice("fork", "spawn"),
    "VLLM_LOGGING_LEVEL": _choice("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    "VLLM_LOG_STATS_INTERVAL": _FLOAT,
    "VLLM_LOG_BATCHSIZE_INTERVAL": _FLOAT,
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": _BOOL,
    "VLLM_KV_CACHE_LAYOUT": _choice("NHD", "HND"),
    "VLLM_DISABLE_COMPILE_CACHE": _BOOL,
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": _INT,
    "VLLM_ENGINE_READY_TIMEOUT_S": _INT,
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": _BOOL,
    # OpenMP (not OMP_TOOL / OMP_TOOL_LIBRARIES, which load libraries)
    "OMP_NUM_THREADS": Value("int", minimum=1),
    "OMP_PROC_BIND": _WORD,
    "OMP_PLACES": _WORD,
    "OMP_SCHEDULE": _WORD,
    "OMP_DYNAMIC": _choice("true", "false"),
    "OMP_WAIT_POLICY": _choice("active", "passive", "ACTIVE", "PASSIVE"),
    "OMP_STACKSIZE": _WORD,
    "OMP_MAX_ACTIVE_LEVELS": _INT,
    "OMP_THREAD_LIMIT": Value("int", minimum=1),
    "OMP_DISPLAY_ENV": _choice("true", "false", "verbose"),
    "OMP_DISPLAY_AFFINITY": _choice("true", "false"),
    # CUDA's device selection
    "CUDA_VISIBLE_DEVICES": Value("devices"),
    # cache locations, under the data directory
    "VLLM_CACHE_ROOT": _CACHE,
    "VLLM_ASSETS_CACHE": _CACHE,
    "HF_HOME": _CACHE,
    "HF_HUB_CACHE": _CACHE,
    "XDG_CACHE_HOME": _CACHE,
    "TORCHINDUCTOR_CACHE_DIR": _CACHE,
    "TRITON_CACHE_DIR": _CACHE,
}
# What kvscope sets itself: the engine stays offline and keeps its files in its folder.
KVSCOPE_SETS = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
    "TMPDIR",
    "PYTHONUNBUFFERED",
    "VLLM_TARGET_DEVICE",
)
_ENV_WHY: dict[str, str] = {
    "BROWSER": "Python's webbrowser module runs it as a command",
    "VLLM_PLUGINS": "it makes vLLM import and run plugins",
    "VLLM_LOGGING_CONFIG_PATH": "a logging config can create any Python object",
    "VLLM_CONFIGURE_LOGGING": "it goes with a logging config, which can create any Python object",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "it lets vLLM unpickle data, which can run code",
    "VLLM_SERVER_DEV_MODE": "it opens vLLM's development endpoints",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "it lets requests load adapters at run time",
    "VLLM_USE_MODELSCOPE": "it changes where models are fetched from",
    "HF_ENDPOINT": "it changes where models are fetched from",
    "VLLM_HOST_IP": "it changes which network the engine talks on",
    "VLLM_PORT": "it changes which ports the engine opens",
    "OMP_TOOL": "it makes OpenMP load tool libraries",
    "OMP_TOOL_LIBRARIES": "OpenMP loads the libraries it names",
}


@dataclass(frozen=True)
class Refusal:
    """Why one variable or flag may not be set by someone: `who` may set it."""

    item: str
    why: str
    who: Who

    def __str__(self) -> str:
        return f"{self.item}: {self.why}"


def env_refusal(name: str, value: str) -> Refusal | None:
    """Who may set variable `name` to `value` (None: anyone who may configure engines)."""
    if not ENV_NAME_RE.fullmatch(name):
        return Refusal(
            name, "not a valid variable name (letters, digits and '_', not first a digit)", "never"
        )
    if is_secret_key(name) or name.startswith(TOKEN_PREFIX):
        return Refusal(name, f"looks like a secret; {SECRET_HINT}", "never")
    if _TOKEN_SHAPE.search(value):
        return Refusal(name, f"its value looks like a token; {SECRET_HINT}", "never")
    if "\0" in value:
        return Refusal(name, "a value cannot hold a NUL character", "never")
    rule = ENV.get(name)
    if rule is not None:
        problem = rule.problem(value)
        return None if problem is None else Refusal(name, problem, "never")
    return Refusal(name, _env_why(name), "unsafe")


def _env_why(name: str) -> str:
    if name in _ENV_WHY:
        return _ENV_WHY[name]
    if name in KVSCOPE_SETS:
        return "kvscope sets it (the engine stays offline, its files in its own folder)"
    if name.startswith("LD_"):
        return "the dynamic linker loads code from it into every engine process"
    if name.startswith("PYTHON"):
        return "it changes what the engine's Python imports or runs"
    if name.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_")):
        return "it changes how models are fetched (the model source is the machine owner's)"
    return "not on the allowlist of engine variables (docs/engine.md)"


def env_refusals(env: Mapping[str, str]) -> list[Refusal]:
    """Each variable of `env` that not everyone may set, with why."""
    return [r for k, v in env.items() if (r := env_refusal(k, v)) is not None]


def outside_data_dir(env: Mapping[str, str], data_dir: Path) -> list[str]:
    """Cache variables whose folder is not under the data directory."""
    root = os.path.realpath(data_dir)
    return [
        f"{k}: {v} is not under the data directory {data_dir}"
        for k, v in env.items()
        if ENV.get(k) == _CACHE and not Path(os.path.realpath(v)).is_relative_to(root)
    ]


# -- vllm serve flags -----------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """A known `vllm serve` flag: its value (None: a switch) and who may give it."""

    value: Value | None = None
    who: Who = "anyone"
    negatable: bool = True  # a switch also has a --no- form
    why: str = ""


_POS = Value("int", minimum=1)
FLAGS: dict[str, Flag] = {
    "--seed": Flag(_INT),
    "--max-logprobs": Flag(_INT),
    "--max-log-len": Flag(_INT),
    "--long-prefill-token-threshold": Flag(_INT),
    "--pipeline-parallel-size": Flag(_POS),
    "--data-parallel-size": Flag(_POS),
    "--api-server-count": Flag(_POS),
    "--stream-interval": Flag(_POS),
    "--max-cudagraph-capture-size": Flag(_POS),
    "--max-parallel-loading-workers": Flag(_POS),
    "--shutdown-timeout": Flag(_INT),
    "--cpu-offload-gb": Flag(_FLOAT),
    "--scheduling-policy": Flag(_choice("fcfs", "priority")),
    "--prefix-caching-hash-algo": Flag(_choice("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")),
    "--uvicorn-log-level": Flag(_choice("critical", "error", "warning", "info", "debug", "trace")),
    "--load-format": Flag(_choice("auto", "pt", "safetensors", "npcache", "dummy")),
    "--tokenizer-mode": Flag(_choice("auto", "hf", "slow", "mistral")),
    "--distributed-executor-backend": Flag(_choice("mp", "uni")),
    "--quantization": Flag(
        _choice(
            "awq",
            "awq_marlin",
            "gptq",
            "gptq_marlin",
            "marlin",
            "fp8",
            "bitsandbytes",
            "compressed-tensors",
        )
    ),
    "--disable-log-stats": Flag(negatable=False),
    "--enable-log-requests": Flag(),
    "--enable-prompt-tokens-details": Flag(),
    "--enable-force-include-usage": Flag(),
    "--enable-server-load-tracking": Flag(),
    "--disable-sliding-window": Flag(),
    "--disable-cascade-attn": Flag(),
    "--disable-custom-all-reduce": Flag(),
    "--disable-hybrid-kv-cache-manager": Flag(),
    "--disable-uvicorn-access-log": Flag(),
    "--disable-fastapi-docs": Flag(),
    "--async-scheduling": Flag(),
    "--enable-expert-parallel": Flag(),
    "--kv-cache-metrics": Flag(),
    # The machine owner's: the model's own code, files on this machine, the model's source.
    "--trust-remote-code": Flag(who="owner", why="it runs Python code that comes with the model"),
    "--chat-template": Flag(Value("path"), "owner", why="it names a file on this machine"),
    "--tokenizer": Flag(_WORD, "owner", why="it names a tokenizer's source"),
    "--revision": Flag(_WORD, "owner", why="it chooses the model's source"),
    "--tokenizer-revision": Flag(_WORD, "owner", why="it chooses the tokenizer's source"),
    "--download-dir": Flag(Value("path"), "owner", why="it names a folder on this machine"),
    "--generation-config": Flag(_WORD, "owner", why="it names a file on this machine"),
    "--allowed-local-media-path": Flag(
        Value("path"), "owner", why="it lets requests read files on this machine"
    ),
    "--ssl-keyfile": Flag(Value("path"), "owner", why="it names a file on this machine"),
    "--ssl-certfile": Flag(Value("path"), "owner", why="it names a file on this machine"),
    "--ssl-ca-certs": Flag(Value("path"), "owner", why="it names a file on this machine"),
    "--root-path": Flag(_WORD, "owner", why="it changes the engine's URL paths"),
    "--uds": Flag(Value("path"), "owner", why="it names a socket on this machine"),
}
# Flags with a field of their own in the spec: set there, typed and shown.
FIELD_FLAGS: dict[str, str] = {
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--host": "host",
    "--port": "port",
    "--dtype": "dtype",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--enable-chunked-prefill": "enable_chunked_prefill",
    "--no-enable-chunked-prefill": "enable_chunked_prefill",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--kv-cache-memory-bytes": "kv_cache_memory_bytes",
    "--block-size": "block_size",
    "--num-gpu-blocks-override": "num_gpu_blocks_override",
    "--tensor-parallel-size": "tensor_parallel_size",
    "--enforce-eager": "enforce_eager",
}
SECRET_FLAGS: dict[str, str] = {"--api-key": "--api-key-env", "--hf-token": "--hf-token-env"}
_CODE = "it imports and runs the Python code it names"
_FLAG_WHY: dict[str, str] = {
    "--middleware": _CODE,
    "--tool-parser-plugin": _CODE,
    "--reasoning-parser-plugin": _CODE,
    "--io-processor-plugin": _CODE,
    "--logits-processors": _CODE,
    "--worker-cls": _CODE,
    "--worker-extension-cls": _CODE,
    "--scheduler-cls": _CODE,
    "--log-config-file": "a logging config can create any Python object",
    "--logging-config": "a logging config can create any Python object",
    "--config": "it reads more flags from a file",
    "--lora-modules": "it loads adapters from files on this machine",
    "--allowed-origins": "it lets other web sites call the engine from a browser",
}


@dataclass(frozen=True)
class Arg:
    """One flag of the extra arguments, with its value and, unless anyone may give it, why."""

    flag: str
    value: str | None
    tokens: tuple[str, ...]
    refusal: Refusal | None

    @property
    def who(self) -> Who:
        return "anyone" if self.refusal is None else self.refusal.who


def _flag_refusal(flag: str, value: str | None) -> Refusal | None:
    if flag in SECRET_FLAGS:
        return Refusal(flag, f"a secret on the command line; {SECRET_HINT}", "never")
    if flag in FIELD_FLAGS:
        field = FIELD_FLAGS[flag]
        return Refusal(flag, f"has a field of its own: set {field} (--set {field}=…)", "never")
    if value is not None and _TOKEN_SHAPE.search(value):
        return Refusal(flag, f"its value looks like a token; {SECRET_HINT}", "never")
    base = flag.removeprefix("--no-")
    known = FLAGS.get(flag) or (FLAGS.get(f"--{base}") if flag.startswith("--no-") else None)
    if known is None or (flag.startswith("--no-") and not known.negatable):
        return Refusal(
            flag,
            _FLAG_WHY.get(flag, "not a vllm serve flag kvscope knows (docs/engine.md)"),
            "unsafe",
        )
    if known.value is None:
        if value is not None:
            return Refusal(flag, f"is a switch and takes no value (got {value!r})", "never")
    elif value is None:
        return Refusal(flag, "needs a value", "never")
    elif (problem := known.value.problem(value)) is not None:
        return Refusal(flag, problem, "never")
    return None if known.who == "anyone" else Refusal(flag, known.why, known.who)


def review_args(args: Iterable[str]) -> list[Arg]:
    """The extra arguments as flags with their values, each judged. A value follows its flag
    (`--seed 1` or `--seed=1`); a word that follows no flag is refused."""
    tokens = list(args)
    out: list[Arg] = []
    seen: set[str] = set()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or len(token) < 3:
            out.append(Arg(token, None, (token,), Refusal(token, "is not a --flag", "never")))
            i += 1
            continue
        flag, eq, value = token.partition("=")
        used: tuple[str, ...] = (token,)
        takes_value = _takes_value(flag)
        if not eq and takes_value and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            value, used = tokens[i + 1], (token, tokens[i + 1])
        elif not eq and not takes_value and i + 1 < len(tokens):
            nxt = tokens[i + 1]
            if not nxt.startswith("-") and flag in FLAGS:  # a value given to a switch
                value, used = nxt, (token, nxt)
        given: str | None = value if (eq or len(used) == 2) else None
        refusal = _flag_refusal(flag, given)
        name = flag.removeprefix("--no-") if flag.startswith("--no-") else flag.removeprefix("--")
        if refusal is None and name in seen:
            refusal = Refusal(flag, "is given twice", "never")
        seen.add(name)
        out.append(Arg(flag, given, used, refusal))
        i += len(used)
    return out


def _takes_value(flag: str) -> bool:
    """Whether a flag is followed by a value: known flags say; an unknown one is taken to
    take the next word (the owner's, with --allow-unsafe)."""
    if flag in FLAGS:
        return FLAGS[flag].value is not None
    if flag in FIELD_FLAGS:
        return not flag.removeprefix("--no-").startswith(("enable-", "enforce-"))
    return not (flag.startswith("--no-") and f"--{flag[5:]}" in FLAGS)


def arg_refusals(args: Iterable[str]) -> list[Refusal]:
    """Each flag of the extra arguments that not everyone may give, with why."""
    return [a.refusal for a in review_args(args) if a.refusal is not None]


def not_allowed(refusals: Iterable[Refusal], owner: bool, allow_unsafe: bool) -> list[str]:
    """The refusals that hold for this setter, each as `item: why; who may`."""
    out = []
    for r in refusals:
        if r.who == "never":
            out.append(str(r))
        elif r.who == "unsafe" and not (owner and allow_unsafe):
            out.append(f"{r}; {UNSAFE_ONLY}" if owner else f"{r}; {OWNER_ONLY}")
        elif r.who == "owner" and not owner:
            out.append(f"{r}; {OWNER_ONLY}")
    return out


@dataclass(frozen=True)
class Owned:
    """A variable or flag only the machine's owner may set: as written, why, and whether it
    also takes --allow-unsafe."""

    text: str
    why: str
    unsafe: bool


def owner_items(env: Mapping[str, str], args: Iterable[str]) -> dict[str, Owned]:
    """The variables and flags of a spec only the machine's owner may set, by name."""
    items: dict[str, Owned] = {}
    for k, v in env.items():
        r = env_refusal(k, v)
        if r is not None and r.who in ("owner", "unsafe"):
            items[k] = Owned(f"{k}={v}", r.why, r.who == "unsafe")
    for a in review_args(args):
        if a.refusal is not None and a.who in ("owner", "unsafe"):
            items[a.flag] = Owned(" ".join(a.tokens), a.refusal.why, a.who == "unsafe")
    return items


def anyones_part(env: Mapping[str, str], args: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """The variables and argument words anyone who configures engines may change (what a
    form edits; the owner's part is kept as it is)."""
    owned = owner_items(env, [])
    mine = [t for a in review_args(args) if a.who not in ("owner", "unsafe") for t in a.tokens]
    return {k: v for k, v in env.items() if k not in owned}, mine


def owners_part(env: Mapping[str, str], args: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """The variables and argument words only the machine's owner may change."""
    owned = owner_items(env, [])
    theirs = [t for a in review_args(args) if a.who in ("owner", "unsafe") for t in a.tokens]
    return {k: v for k, v in env.items() if k in owned}, theirs
