"""Pydantic models at the store's edge: what callers hand in, and the plain data queries return.

Validation lives here so the console form, the CLI and the worker refuse the same bad
input with the same message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from planner.errors import InvalidInput, OutboundRefused, validation_message
from storage.outbound import check_token_env

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
# Target labels as Prometheus spells label names; values are free text, one line.
LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
MAX_LABELS, MAX_LABEL_VALUE = 20, 200


# A PromQL label selector: matchers of a label name, an operator, a double-quoted value.
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
SELECTOR_RE = re.compile(rf"^\{{(?:{_MATCHER}(?:,{_MATCHER})*,?\s*)?\}}$")
SELECTOR_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def parse_selector(text: str | None) -> str:
    """A PromQL label selector (`{job="vllm",instance="10.0.0.5:8000"}`), checked, or `{}`
    for none; a clear error says what is wrong with it."""
    text = (text or "").strip() or "{}"
    if not text.startswith("{"):
        text = "{" + text + "}"
    if not SELECTOR_RE.match(text):
        raise InvalidInput(
            f"selector {text!r}: give PromQL label matchers such as "
            '{job="vllm",instance="10.0.0.5:8000"} (=, !=, =~ or !~, values in double quotes)'
        )
    return text


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """Label names as Prometheus allows them, short one-line values, at most 20."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, got {len(labels)}")
    for key, value in labels.items():
        if not LABEL_RE.match(key) or key.startswith("__"):
            raise ValueError(
                f"label name {key!r}: letters, digits and '_', not starting with a digit or '__'"
            )
        if not value or len(value) > MAX_LABEL_VALUE or "\n" in value:
            raise ValueError(f"label {key}: a value of 1-{MAX_LABEL_VALUE} characters, one line")
    return labels


def parse_labels(text: str | Iterable[str]) -> dict[str, str]:
    """`pool=a, region=eu` (or the pairs one by one) as a dict; a clear error names the bad
    pair."""
    pairs = text.split(",") if isinstance(text, str) else list(text)
    out: dict[str, str] = {}
    for pair in pairs:
        if not pair.strip():
            continue
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidInput(f"label {pair.strip()!r}: give it as name=value")
        out[key.strip()] = value.strip()
    try:
        return check_labels(out)
    except ValueError as err:
        raise InvalidInput(str(err)) from err


def normalize_base_url(url: str) -> str:
    """Validate an engine URL and return its base (no trailing `/metrics`, no slash)."""
    raw = url.strip()
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        got = f" (got {parts.scheme!r})" if parts.scheme else ""
        raise InvalidInput(f"target URL {url!r} must start with http:// or https://{got}")
    if not parts.hostname:
        raise InvalidInput(f"target URL {url!r} has no host name")
    try:
        _ = parts.port
    except ValueError as err:
        raise InvalidInput(f"target URL {url!r} has an invalid port") from err
    path = parts.path.rstrip("/")
    if path.endswith("/metrics"):
        path = path[: -len("/metrics")]
    return f"{parts.scheme}://{parts.netloc}{path}"


class ScrapeLimits(BaseModel):
    """How one target is scraped, and what a scrape may bring: over a limit, the scrape fails
    with the reason and stores nothing but `up` = 0 and its duration (as Prometheus does).

    Defaults come from the settings (`KVSCOPE_SCRAPE_INTERVAL_S`, `KVSCOPE_SCRAPE_TIMEOUT_S`,
    `KVSCOPE_SCRAPE_LIMITS__*`); a target may override any of them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(2.0, ge=0.2, le=300.0, description="seconds between scrapes")
    timeout_s: float = Field(
        3.0,
        gt=0,
        le=60.0,
        description="the whole scrape: connect, headers, body; at most the interval",
    )
    body_limit_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="bytes of the (decompressed) metrics page"
    )
    sample_limit: int = Field(20_000, ge=1, description="sample lines in one page")
    label_limit: int = Field(
        100, ge=1, description="labels on one sample (vLLM 0.32's cache_config_info has 37)"
    )
    label_value_length_limit: int = Field(2048, ge=16, description="characters of one label value")
    series_limit: int = Field(
        10_000,
        ge=1,
        description="series stored for one target (a new label value each scrape "
        "would otherwise add series forever)",
    )

    @property
    def deadline_s(self) -> float:
        """The effective timeout: a scrape never outlasts its interval."""
        return min(self.timeout_s, self.interval_s)

    def merged(self, overrides: Mapping[str, Any] | None) -> ScrapeLimits:
        """These limits with a target's overrides applied (validated: InvalidInput)."""
        if not overrides:
            return self
        try:
            return ScrapeLimits.model_validate(self.model_dump() | dict(overrides))
        except ValidationError as err:
            raise InvalidInput(f"invalid scrape settings: {validation_message(err)}") from err


class ProbeLimits(BaseModel):
    """What one probe may ask of an engine and of the worker: a request over a limit is
    refused before anything runs (`KVSCOPE_PROBE_LIMITS__*`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_rate: float = Field(1000.0, gt=0, description="requests per second")
    max_duration_s: float = Field(4 * 3600.0, gt=0, description="seconds of load in one step")
    max_requests: int = Field(100_000, ge=1, description="requests one run plans in all")
    max_in_flight: int = Field(
        512,
        ge=1,
        description="requests in flight at once: a closed loop's concurrency, and in an open "
        "loop the point past which a due request is recorded as not sent (and so a miss)",
    )
    max_run_s: float = Field(6 * 3600.0, gt=0, description="a whole run, all steps: its deadline")


class TargetIn(BaseModel):
    """A target as a user describes it."""

    model_config = ConfigDict(str_strip_whitespace=True)

    name: str
    base_url: str
    managed: bool = False
    enabled: bool = True
    token_env: str | None = None
    # Where it belongs (model, pool, region, ...): the Overview groups and the Fleet page
    # filters by them, alert rules may apply per label.
    labels: dict[str, str] = Field(default_factory=dict)
    # "prometheus": base_url is a Prometheus server that scrapes the engine, `selector`
    # picks the engine's series there; the worker reads them instead of scraping.
    source: Literal["scrape", "prometheus"] = "scrape"
    selector: str | None = None
    # Overrides of the worker's scrape settings (ScrapeLimits field names), checked on save.
    scrape: dict[str, float] = Field(default_factory=dict)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_labels(v)

    @model_validator(mode="after")
    def _source(self) -> TargetIn:
        if self.source == "prometheus":
            try:
                self.selector = parse_selector(self.selector)
            except InvalidInput as err:
                raise ValueError(str(err)) from err
            if self.managed:
                raise ValueError("a managed engine is scraped, not read from Prometheus")
        elif self.selector:
            raise ValueError("a selector is for a target read from Prometheus (--prometheus)")
        return self

    @field_validator("scrape")
    @classmethod
    def _scrape(cls, v: dict[str, float]) -> dict[str, float]:
        ScrapeLimits().merged(v)  # unknown names and bad values are refused here
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                "name must be 1-100 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        try:
            return normalize_base_url(v)
        except InvalidInput as err:
            raise ValueError(str(err)) from err

    @field_validator("token_env")
    @classmethod
    def _env(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        if not ENV_RE.match(v):
            raise ValueError(
                "token variable must be an environment variable name, e.g. KVSCOPE_TOKEN_PROD"
            )
        try:
            check_token_env(v)
        except OutboundRefused as err:
            raise ValueError(str(err)) from err
        return v


class TargetRow(BaseModel):
    """A stored target with its health and cache facts."""

    id: int
    name: str
    base_url: str
    managed: bool
    enabled: bool
    model_name: str | None
    token_env: str | None
    labels: dict[str, Any]
    health: str
    health_message: str | None
    consecutive_failures: int
    last_scrape_at: float | None
    last_success_at: float | None
    num_gpu_blocks: int | None
    block_size: int | None
    cache_dtype: str | None
    cache_info: dict[str, Any]
    scrape: dict[str, float] = Field(default_factory=dict)
    source: str = "scrape"
    selector: str | None = None


class AllowedHostRow(BaseModel):
    """An allowlist entry: from the `allowed_hosts` table, or from KVSCOPE_ALLOWED_HOSTS."""

    pattern: str
    source: str  # "table" or "setting"
    note: str | None = None
    added_by: str | None = None
    added_at: float | None = None


class EventRow(BaseModel):
    """A stored event."""

    id: int
    ts: float
    target_id: int | None
    kind: str
    severity: str
    message: str
    data: dict[str, Any]
    actor: str | None = None


class RunRow(BaseModel):
    """A stored work request / probe run."""

    id: int
    kind: str
    target_id: int | None
    params: dict[str, Any]
    status: str
    progress: float
    summary: dict[str, Any]
    error: str | None
    cancel_requested: bool
    created_at: float
    started_at: float | None
    finished_at: float | None
    deadline_at: float | None = None
    requested_by: str | None = None


class ScheduleRow(BaseModel):
    """A stored probe schedule."""

    id: int
    target_id: int
    kind: str
    params: dict[str, Any]
    every_s: float
    enabled: bool
    created_at: float


class AlertRow(BaseModel):
    """An alert with the names of its rule and target."""

    id: int
    rule_id: int
    rule: str
    target_id: int
    target: str
    severity: str
    state: str
    started_at: float
    resolved_at: float | None
    value: float | None
    message: str
    acknowledged_by: str | None = None
    acknowledged_at: float | None = None


class Lockout(BaseModel):
    """How many wrong passwords within `window_s` lock a user name out, and for how long
    (`KVSCOPE_SIGNIN_LOCKOUT__*`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_failures: int = Field(5, ge=1, le=100)
    window_s: float = Field(900.0, gt=0)
    lock_s: float = Field(900.0, gt=0)
