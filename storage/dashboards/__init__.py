"""What each console page shows, computed in one call per page: plain data, no Streamlit.

Pages stay thin: they pick a target and a window, call one function here, and render.
`monitor` serves the live pages (Overview, Live, Tail, Engine); `plans` the pages that
judge and price (SLOs, Cost). Both are re-exported here.
"""

from storage.dashboards.monitor import (
    HEARTBEAT_STALE_S,
    SUMMARY_WINDOW_S,
    EngineView,
    OverviewRow,
    WorkerStatus,
    engine_view,
    live,
    overview,
    tail,
    worker_status,
)
from storage.dashboards.plans import (
    MeasuredPoint,
    QueueInputs,
    SloReport,
    burn_rate,
    measured_cold_starts,
    measured_points,
    queue_inputs,
    slo_reports,
)

__all__ = [
    "HEARTBEAT_STALE_S",
    "SUMMARY_WINDOW_S",
    "EngineView",
    "MeasuredPoint",
    "OverviewRow",
    "QueueInputs",
    "SloReport",
    "WorkerStatus",
    "burn_rate",
    "engine_view",
    "live",
    "measured_cold_starts",
    "measured_points",
    "overview",
    "queue_inputs",
    "slo_reports",
    "tail",
    "worker_status",
]
