"""Pydantic models at the store's edge: what callers hand in, and the plain data queries return.

Validation lives here so the console form, the CLI and the worker refuse the same bad
input with the same message.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from planner.errors import InvalidInput

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")


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


class TargetIn(BaseModel):
    """A target as a user describes it."""

    model_config = ConfigDict(str_strip_whitespace=True)

    name: str
    base_url: str
    managed: bool = False
    enabled: bool = True
    token_env: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)

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
            raise ValueError("token variable must be an environment variable name, e.g. VLLM_TOKEN")
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


class EventRow(BaseModel):
    """A stored event."""

    id: int
    ts: float
    target_id: int | None
    kind: str
    severity: str
    message: str
    data: dict[str, Any]


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
