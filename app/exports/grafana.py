"""kvscope's Live and Tail pages as a Grafana dashboard over Prometheus.

The panels draw what the console's pages draw, from the same canonical metrics
(storage/names.py) under every vLLM spelling; docs/exports.md describes the variables.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.exports.promql import BY, gauge, per_second, quantile, tail_ratio
from probes.vllm.metrics import CACHE_CONFIG, SPELLINGS
from storage.names import LATENCY_HISTOGRAMS, METRICS, QUANTILES

# The series every vLLM version exposes with `model_name`: the dashboard's variables read it.
LABEL_SOURCE = "vllm:num_requests_running"

DASHBOARD_UID = "kvscope-vllm"
SCHEMA_VERSION = 39  # Grafana 10.4 / 11.0; newer Grafana migrates it on load
TAIL_WINDOWS = ("1m", "5m", "15m", "30m", "1h")
TAIL_WINDOW_DEFAULT = "5m"  # the Tail page's trailing window
_DS = {"type": "prometheus", "uid": "${datasource}"}
_SELECTED = 'model_name=~"$model_name", instance=~"$instance"'
_RATE = "$__rate_interval"
_LEGEND = "{{instance}} {{model_name}}"
_SHORT = {"queue_time": "queue"}


def _kv_with_blocks() -> str:
    """KV usage carrying `num_gpu_blocks` from vllm:cache_config_info as a label.

    PromQL cannot read a label as a number, so free blocks, (1 - usage) x (blocks - 1),
    cannot be drawn; the legend shows the block total instead. `or on` keeps the line for
    an engine that lacks the info metric.
    """
    kv = f"avg by ({BY}) ({gauge('kv_usage', _SELECTED)})"
    info = (
        f"topk by (instance) (1, max by (instance, num_gpu_blocks) "
        f'({CACHE_CONFIG}{{instance=~"$instance"}}))'
    )
    return (
        f"(\n  {kv}\n  * on (instance) group_left (num_gpu_blocks)\n  {info}\n)\nor on ({BY})\n{kv}"
    )


def _sum_rate(canonical: str) -> str:
    return f"sum by ({BY}) ({per_second(canonical, _SELECTED, _RATE)})"


def _live_panels() -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """(title, unit, description, [(expr, legend)]) of the Live page's charts, in order."""
    hit_rate = (
        f"{_sum_rate('prefix_cache_hits_total')}\n/\n{_sum_rate('prefix_cache_queries_total')}"
    )
    return [
        (
            "KV cache usage",
            "percentunit",
            "Share of the KV cache in use. Free blocks = (1 - usage) x (num_gpu_blocks - 1); "
            "the block total (from vllm:cache_config_info) is in the legend.",
            [(_kv_with_blocks(), f"{_LEGEND} ({{{{num_gpu_blocks}}}} blocks)")],
        ),
        (
            "Requests in the engine",
            "short",
            "Requests running (in the batch) and waiting (queued).",
            [
                (f"sum by ({BY}) ({gauge('running', _SELECTED)})", f"running {_LEGEND}"),
                (f"sum by ({BY}) ({gauge('waiting', _SELECTED)})", f"waiting {_LEGEND}"),
            ],
        ),
        (
            "Preemptions",
            "short",
            "Preemptions per second: requests evicted because the KV cache ran out.",
            [(_sum_rate("preemptions_total"), _LEGEND)],
        ),
        (
            "Tokens per second",
            "short",
            "Prompt (prefill) and generation (decode) tokens per second.",
            [
                (_sum_rate("prompt_tokens_total"), f"prompt {_LEGEND}"),
                (_sum_rate("generation_tokens_total"), f"generation {_LEGEND}"),
            ],
        ),
        (
            "Prefix cache hit rate",
            "percentunit",
            "Prefix-cache hits over queries, in tokens.",
            [(hit_rate, _LEGEND)],
        ),
        (
            "Finished requests",
            "reqps",
            "Requests finished per second, whatever the finish reason.",
            [(_sum_rate("requests_finished_total"), _LEGEND)],
        ),
    ]


def _tail_panels() -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """The Tail page's charts: p50/p95/p99 of each latency histogram, then p99/p50."""
    panels = []
    for h in LATENCY_HISTOGRAMS:
        targets = [
            (quantile(q, h, _SELECTED, "$tail_window"), f"p{round(q * 100)} {_LEGEND}")
            for q in QUANTILES
        ]
        panels.append(
            (
                f"{METRICS[h].title} p50 / p95 / p99",
                "s",
                f"Quantiles of {SPELLINGS[h][0]} over the trailing $tail_window, "
                "bucket-interpolated by histogram_quantile.",
                targets,
            )
        )
    ratios = [
        (tail_ratio(h, _SELECTED, "$tail_window"), f"{_SHORT.get(h, h.upper())} {_LEGEND}")
        for h in LATENCY_HISTOGRAMS
    ]
    panels.append(
        (
            "Tail ratio p99 / p50",
            "none",
            "How far the tail drifts from the median, per latency histogram.",
            ratios,
        )
    )
    return panels


def _timeseries_panel(
    panel_id: int, x: int, y: int, spec: tuple[str, str, str, list[tuple[str, str]]]
) -> dict[str, Any]:
    title, unit, description, queries = spec
    defaults: dict[str, Any] = {"unit": unit, "min": 0}
    if unit == "percentunit":
        defaults["max"] = 1
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": dict(_DS),
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": dict(_DS),
                "editorMode": "code",
                "expr": expr,
                "legendFormat": legend,
                "range": True,
            }
            for i, (expr, legend) in enumerate(queries)
        ],
    }


def _panels() -> list[dict[str, Any]]:
    """A row per page, its charts two to a line below it."""
    out: list[dict[str, Any]] = []
    y = 0
    for row_title, specs in (("Live", _live_panels()), ("Tail", _tail_panels())):
        out.append(
            {
                "id": len(out) + 1,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, spec in enumerate(specs):
            out.append(_timeseries_panel(len(out) + 1, 12 * (i % 2), y + 8 * (i // 2), spec))
        y += 8 * ((len(specs) + 1) // 2)
    return out


def _label_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": dict(_DS),
        "query": query,
        "refresh": 2,  # on time range change: new servers appear without a reload
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
        "hide": 0,
        "regex": "",
    }


def _templating(datasource_uid: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Prometheus",
            "query": "prometheus",
            "current": {"text": datasource_uid, "value": datasource_uid},
            "hide": 0,
            "refresh": 1,
            "regex": "",
        },
        _label_variable("model_name", "Model", f"label_values({LABEL_SOURCE}, model_name)"),
        _label_variable(
            "instance",
            "Instance",
            f'label_values({LABEL_SOURCE}{{model_name=~"$model_name"}}, instance)',
        ),
        {
            "type": "interval",
            "name": "tail_window",
            "label": "Tail window",
            "query": ",".join(TAIL_WINDOWS),
            "current": {"text": TAIL_WINDOW_DEFAULT, "value": TAIL_WINDOW_DEFAULT},
            "options": [
                {"text": w, "value": w, "selected": w == TAIL_WINDOW_DEFAULT} for w in TAIL_WINDOWS
            ],
            "auto": False,
            "refresh": 2,
            "hide": 0,
        },
    ]


def grafana_dashboard(
    datasource_uid: str = "${DS_PROMETHEUS}", title: str = "kvscope: vLLM live and tail"
) -> dict[str, Any]:
    """A Grafana dashboard model with the Live and Tail panels over Prometheus.

    The default `${DS_PROMETHEUS}` makes it an importable file: Grafana's Import asks
    for the Prometheus data source. Pass a data source uid to provision it as is.
    """
    model: dict[str, Any] = {}
    placeholder = re.fullmatch(r"\$\{(\w+)\}", datasource_uid)
    if placeholder:
        model["__inputs"] = [
            {
                "name": placeholder.group(1),
                "label": "Prometheus",
                "description": "The Prometheus that scrapes your vLLM servers",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ]
    model |= {
        "uid": DASHBOARD_UID,
        "title": title,
        "description": "vLLM KV cache, queues, throughput and tail latency (kvscope export)",
        "tags": ["kvscope", "vllm"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": _templating(datasource_uid)},
        "panels": _panels(),
    }
    return model


def grafana_dashboard_json(
    datasource_uid: str = "${DS_PROMETHEUS}", title: str = "kvscope: vLLM live and tail"
) -> str:
    """`grafana_dashboard` as the JSON file Grafana imports."""
    return json.dumps(grafana_dashboard(datasource_uid, title), indent=2) + "\n"
