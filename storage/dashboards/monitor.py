"""The monitor pages' data (Overview, Live, Tail, Engine, the worker banner), one call per
page: stored samples turned into gauges, rates and quantiles on a grid.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel
from sqlalchemy import Engine

from planner.errors import KvscopeError, UnknownChoice
from storage import derived as d
from storage import queries as q
from storage.names import LATENCY_HISTOGRAMS

SUMMARY_WINDOW_S = 300.0
HEARTBEAT_STALE_S = 20.0


class OverviewRow(BaseModel):
    """One target on the Overview page."""

    name: str
    base_url: str
    health: str
    health_message: str | None
    model_name: str | None
    kv_usage: float | None
    running: float | None
    waiting: float | None
    preemptions_per_s: float | None
    ttft_p99_s: float | None
    itl_p99_s: float | None
    num_gpu_blocks: int | None
    block_size: int | None
    last_scrape_at: float | None
    labels: dict[str, str] = {}


class Pool(BaseModel):
    """Replicas that share a label value (or all of them): side by side, with totals."""

    label: str | None  # the label grouped by (None: every replica selected)
    value: str | None  # its value here (None: replicas without the label)
    replicas: list[OverviewRow]
    hot: str | None  # the fullest KV cache (the longer queue breaks ties)
    running: float
    waiting: float
    kv_usage_mean: float | None
    kv_usage_max: float | None
    ttft_p99_max_s: float | None
    preemptions_per_s: float
    down: int


def _hot(rows: list[OverviewRow]) -> str | None:
    ranked = [r for r in rows if r.kv_usage is not None or r.waiting is not None]
    if not ranked:
        return None
    return max(ranked, key=lambda r: (r.kv_usage or 0.0, r.waiting or 0.0)).name


def fleet(
    rows: list[OverviewRow], selector: dict[str, str] | None = None, by: str | None = None
) -> list[Pool]:
    """The replicas whose labels match `selector`, in pools by the value of label `by`."""
    chosen = [r for r in rows if all(r.labels.get(k) == v for k, v in (selector or {}).items())]
    groups: dict[str | None, list[OverviewRow]] = {}
    for r in chosen:
        groups.setdefault(r.labels.get(by) if by else None, []).append(r)

    def values(rs: list[OverviewRow], field: str) -> list[float]:
        return [v for r in rs if (v := getattr(r, field)) is not None]

    pools = []
    for value, rs in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        kv = values(rs, "kv_usage")
        ttft = values(rs, "ttft_p99_s")
        pools.append(
            Pool(
                label=by,
                value=value,
                replicas=rs,
                hot=_hot(rs),
                running=sum(values(rs, "running")),
                waiting=sum(values(rs, "waiting")),
                kv_usage_mean=sum(kv) / len(kv) if kv else None,
                kv_usage_max=max(kv) if kv else None,
                ttft_p99_max_s=max(ttft) if ttft else None,
                preemptions_per_s=sum(values(rs, "preemptions_per_s")),
                down=sum(r.health == "down" for r in rs),
            )
        )
    return pools


def label_keys(rows: list[OverviewRow]) -> list[str]:
    """Every label name the targets carry."""
    return sorted({k for r in rows for k in r.labels})


class WorkerStatus(BaseModel):
    """Is a worker alive, and what does it say about GPUs."""

    alive: bool
    message: str
    gpu_available: bool
    gpu_message: str
    gpus: list[dict[str, Any]]
    # Set while the worker has paused ingest for lack of disk: what to do about it.
    disk_warning: str | None = None


def _num(x: float) -> float | None:
    return None if x is None or np.isnan(x) else float(x)


def overview(store: Engine, now: float | None = None) -> list[OverviewRow]:
    """Every target with its latest gauges and its last five minutes of rates and tails."""
    now = time.time() if now is None else now
    rows = []
    grid = d.point_grid(now, SUMMARY_WINDOW_S)
    for t in q.list_targets(store):
        latest = {
            m: d.gauge(store, t.id, m, grid).iloc[-1] for m in ("kv_usage", "running", "waiting")
        }
        pre = d.rate(store, t.id, "preemptions_total", grid, SUMMARY_WINDOW_S).iloc[-1]
        ttft = d.quantiles(store, t.id, "ttft", grid, SUMMARY_WINDOW_S)["p99"].iloc[-1]
        itl = d.quantiles(store, t.id, "itl", grid, SUMMARY_WINDOW_S)["p99"].iloc[-1]
        rows.append(
            OverviewRow(
                name=t.name,
                base_url=t.base_url,
                health=t.health,
                health_message=t.health_message,
                model_name=t.model_name,
                kv_usage=_num(latest["kv_usage"]),
                running=_num(latest["running"]),
                waiting=_num(latest["waiting"]),
                preemptions_per_s=_num(pre),
                ttft_p99_s=_num(ttft),
                itl_p99_s=_num(itl),
                num_gpu_blocks=t.num_gpu_blocks,
                block_size=t.block_size,
                last_scrape_at=t.last_scrape_at,
                labels={str(k): str(v) for k, v in t.labels.items()},
            )
        )
    return rows


LIVE_GAUGES = ("kv_usage", "running", "waiting")
LIVE_RATES = {
    "preemptions_per_s": "preemptions_total",
    "prompt_tokens_per_s": "prompt_tokens_total",
    "generation_tokens_per_s": "generation_tokens_total",
    "requests_per_s": "requests_finished_total",
}
# The Live page's columns (at rollup resolutions also each gauge's `_max`).
LIVE_COLUMNS = [*LIVE_GAUGES, "free_blocks", *LIVE_RATES, "prefix_hit_rate"]


def live(store: Engine, target_id: int, start: float, end: float) -> pd.DataFrame:
    """The Live page's series on one grid: KV usage, free blocks, queues, rates, hit rate."""
    grid = d.make_grid(start, end)
    target = q.get_target(store, target_id)
    frame = pd.DataFrame(index=pd.Index(grid.points, name="ts"))
    for m in LIVE_GAUGES:
        frame[m] = d.gauge(store, target_id, m, grid).to_numpy()
        if grid.resolution:  # rollups: the peak of each bucket, which its average hides
            frame[f"{m}_max"] = d.gauge(store, target_id, m, grid, stat="max").to_numpy()
    if target.num_gpu_blocks:
        # vLLM: usage = 1 - free / (num_blocks - 1); one block is the reserved null block.
        frame["free_blocks"] = (1.0 - frame["kv_usage"]) * (target.num_gpu_blocks - 1)
    else:
        frame["free_blocks"] = np.nan
    for col, counter in LIVE_RATES.items():
        frame[col] = d.rate(store, target_id, counter, grid).to_numpy()
    hits = d.rate(store, target_id, "prefix_cache_hits_total", grid).to_numpy()
    queries = d.rate(store, target_id, "prefix_cache_queries_total", grid).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["prefix_hit_rate"] = np.where(queries > 0, hits / queries, np.nan)
    frame.attrs.update(
        resolution=grid.resolution, step=grid.step, rate_window_s=d.rate_window(grid)
    )
    return frame


def tail(
    store: Engine, target_id: int, start: float, end: float, window_s: float | None = None
) -> dict[str, pd.DataFrame]:
    """p50/p95/p99 and p99/p50 over time for each latency histogram."""
    grid = d.make_grid(start, end)
    out = {}
    for h in LATENCY_HISTOGRAMS:
        frame = d.quantiles(store, target_id, h, grid, window_s)
        frame.index.name = "ts"
        frame.attrs.update(
            resolution=grid.resolution, step=grid.step, window_s=window_s or max(300.0, grid.step)
        )
        out[h] = frame
    return out


TAIL_COLUMNS = ("p50", "p95", "p99", "ratio")


class SeriesView(BaseModel):
    """A target's canonical series as the Live and Tail pages derive them, for scripts:
    each a list of (time, value or None) on one grid."""

    target: str
    start: float
    end: float
    resolution: int  # 0: raw samples; 60 or 3600: rollups of that many seconds
    step_s: float
    rate_window_s: float  # rates are over windows this long
    series: dict[str, list[tuple[float, float | None]]]


def series_names() -> list[str]:
    """What `series_view` can return: the Live page's columns and each latency histogram's
    quantiles (`ttft_p99`, `itl_ratio`, ...)."""
    return LIVE_COLUMNS + [f"{h}_{c}" for h in LATENCY_HISTOGRAMS for c in TAIL_COLUMNS]


def series_view(
    store: Engine,
    target: str,
    since_s: float,
    metrics: list[str] | None = None,
    now: float | None = None,
) -> SeriesView:
    """The last `since_s` seconds of `target`'s series (all, or those named)."""
    known = series_names()
    wanted = metrics or known
    for m in wanted:
        if m not in known:
            raise UnknownChoice("series", m, known)
    end = time.time() if now is None else now
    start = end - since_s
    row = q.get_target(store, target)
    frame = live(store, row.id, start, end)
    tails = tail(store, row.id, start, end) if any(m not in frame for m in wanted) else {}
    columns: dict[str, pd.Series] = {c: frame[c] for c in frame.columns}
    for h, quantiles in tails.items():
        for c in TAIL_COLUMNS:
            columns[f"{h}_{c}"] = quantiles[c]

    def points(values: pd.Series) -> list[tuple[float, float | None]]:
        return [(float(t), _num(v)) for t, v in zip(values.index, values.to_numpy(), strict=True)]

    return SeriesView(
        target=row.name,
        start=start,
        end=end,
        resolution=int(frame.attrs.get("resolution", 0)),
        step_s=float(frame.attrs.get("step", 0.0)),
        rate_window_s=float(frame.attrs.get("rate_window_s", 0.0)),
        series={m: points(columns[m]) for m in wanted},
    )


def worker_status(store: Engine, now: float | None = None) -> WorkerStatus:
    """Whether a worker heartbeat is fresh, and the GPU state it published."""
    now = time.time() if now is None else now
    hb = q.get_state(store, "worker")
    gpu = q.get_state(store, "gpu")
    alive = bool(hb and hb[0].get("running") and now - hb[1] < HEARTBEAT_STALE_S)
    if alive:
        workers = int(hb[0].get("workers", 1)) if hb else 1
        message = f"worker running (pid {hb[0].get('pid')})" if hb else ""
        if hb and workers > 1:
            message = f"{workers} workers running (the leader: pid {hb[0].get('pid')})"
    elif hb is None:
        message = "no worker has run against this database yet: start `kvscope worker`"
    else:
        message = (
            f"worker not running: last heartbeat {now - hb[1]:.0f} s ago; "
            "start `kvscope worker` (or `kvscope up`)"
        )
    gv = gpu[0] if gpu else {}
    disk = q.get_state(store, "disk")
    return WorkerStatus(
        alive=alive,
        message=message,
        gpu_available=bool(gv.get("available")),
        gpu_message=str(gv.get("message", "GPU state unknown (no worker)")),
        gpus=list(gv.get("gpus", [])),
        disk_warning=str(disk[0]["message"]) if disk and disk[0].get("paused") else None,
    )


class EngineView(BaseModel):
    """What the Engine page shows about one managed engine."""

    name: str
    spec: dict[str, Any]
    desired: str
    started_spec: dict[str, Any] | None  # as last started on request; None: never
    state: dict[str, Any]
    state_age_s: float | None
    log_lines: list[str]
    target: dict[str, Any] | None


def engine_view(store: Engine, name: str, now: float | None = None) -> EngineView:
    """A managed engine's saved spec and the one last started, desired and actual state, log
    tail and scraped cache facts."""
    now = time.time() if now is None else now
    spec, desired = q.get_engine_spec(store, name)
    started = q.get_started_spec(store, name)
    state = q.get_state(store, f"engine:{name}")
    logs = q.get_state(store, f"engine_log:{name}")
    try:
        target: dict[str, Any] | None = q.get_target(store, name).model_dump()
    except KvscopeError:
        target = None
    return EngineView(
        name=name,
        spec=spec,
        desired=desired,
        started_spec=started,
        state=state[0] if state else {"name": name, "status": "never started"},
        state_age_s=now - state[1] if state else None,
        log_lines=list(logs[0].get("lines", [])) if logs else [],
        target=target,
    )
