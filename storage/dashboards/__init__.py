"""What each console page shows, computed in one call per page: plain data, no Streamlit.

Pages stay thin: they pick a target and a window, call one function here, and render.
`monitor` serves the live pages (Overview, Live, Tail, Engine); `plans` the pages that
judge and price (SLOs, Cost); `diagnosis` says which cause broke the tail. All are
re-exported here.
"""

from storage.dashboards.diagnosis import (
    DEFAULT_WINDOW_S,
    Diagnosis,
    Problem,
    VerdictOut,
    diagnose,
    open_problems,
    violation_windows,
)
from storage.dashboards.monitor import (
    HEARTBEAT_STALE_S,
    SUMMARY_WINDOW_S,
    EngineView,
    OverviewRow,
    Pool,
    WorkerStatus,
    engine_view,
    fleet,
    label_keys,
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
    "DEFAULT_WINDOW_S",
    "HEARTBEAT_STALE_S",
    "SUMMARY_WINDOW_S",
    "Diagnosis",
    "EngineView",
    "MeasuredPoint",
    "OverviewRow",
    "Pool",
    "Problem",
    "QueueInputs",
    "SloReport",
    "VerdictOut",
    "WorkerStatus",
    "burn_rate",
    "diagnose",
    "engine_view",
    "fleet",
    "label_keys",
    "live",
    "measured_cold_starts",
    "measured_points",
    "open_problems",
    "overview",
    "queue_inputs",
    "slo_reports",
    "tail",
    "violation_windows",
    "worker_status",
]
