"""kvscope's alert rules as a Prometheus rules file and its Live and Tail pages as a Grafana
dashboard, for teams that already scrape vLLM with Prometheus.

Pure functions, no I/O. Metric names come from `probes/metrics.py`'s SPELLINGS, so the
queries follow vLLM's renames the way the scraper does; docs/exports.md explains each query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, assert_never

from probes.metrics import CACHE_CONFIG, SPELLINGS
from probes.rules import MIN_COUNT, AlertRule, RuleKind
from storage.names import LATENCY_HISTOGRAMS, METRICS, QUANTILES, Kind

# Aggregation labels: vLLM V1 adds `engine` (one per data-parallel rank) and histograms
# add `le`; an alert or a line is per scraped server and model.
BY = "instance, model_name"
# The request-rate resolution the kv_slope steadiness test looks at (the evaluator's 60 s).
REQUEST_RATE_RANGE = "1m"
# The series every vLLM version exposes with `model_name`: the dashboard's variables read it.
LABEL_SOURCE = "vllm:num_requests_running"

# ---------------------------------------------------------------------------------------
# PromQL building blocks


def duration(seconds: float) -> str:
    """A Prometheus duration string: 600 -> `10m`, 90 -> `1m30s`, 0.25 -> `250ms`."""
    ms = round(seconds * 1000)
    if ms <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts)


def _number(value: float) -> str:
    """The shortest PromQL literal that reads back as the same float (`4`, `0.02`)."""
    text = repr(float(value))
    return text.removesuffix(".0")


def _string(value: str) -> str:
    """A PromQL string literal (JSON's escapes are PromQL's)."""
    return json.dumps(value)


def _selectors(canonical: str, matchers: str, part: str = "") -> list[str]:
    """Every exposed name of a canonical metric, newest first: counters with `_total`,
    a histogram's `part` (`bucket`, `count`) as suffix."""
    counter = METRICS[canonical].kind is Kind.COUNTER
    suffix = f"_{part}" if part else "_total" if counter else ""
    braces = f"{{{matchers}}}" if matchers else ""
    return [f"{raw}{suffix}{braces}" for raw in SPELLINGS[canonical]]


def _newest(terms: list[str]) -> str:
    """`a or b`: for each label set the first (newest) spelling wins, as in the scraper.

    Not `{__name__=~"a|b"}`: an engine inside a deprecation window exposes both names,
    and `rate()` over such a selector fails with "vector cannot contain metrics with the
    same labelset" (and a sum would count twice). Callers put the result in parentheses.
    """
    return " or ".join(terms)


def _gauge(canonical: str, matchers: str) -> str:
    return _newest(_selectors(canonical, matchers))


def _per_second(
    canonical: str, matchers: str, window: str, part: str = "", offset: str = ""
) -> str:
    """Per-second rate of a counter (or a histogram part) under each of its names."""
    shift = f" offset {offset}" if offset else ""
    return _newest([f"rate({s}[{window}]{shift})" for s in _selectors(canonical, matchers, part)])


def _observations(canonical: str, matchers: str, window: str, offset: str = "") -> str:
    """How many observations a histogram took in the window, per server and model."""
    shift = f" offset {offset}" if offset else ""
    inner = _newest(
        [f"increase({s}[{window}]{shift})" for s in _selectors(canonical, matchers, "count")]
    )
    return f"sum by ({BY}) ({inner})"


def _quantile(q: float, canonical: str, matchers: str, window: str, offset: str = "") -> str:
    """`histogram_quantile` over the buckets of all engines of a server and model."""
    buckets = _per_second(canonical, matchers, window, "bucket", offset)
    return f"histogram_quantile({_number(q)}, sum by ({BY}, le) ({buckets}))"


def _tail_ratio(canonical: str, matchers: str, window: str) -> str:
    p99 = _quantile(0.99, canonical, matchers, window)
    p50 = _quantile(0.5, canonical, matchers, window)
    return f"{p99}\n/\n{p50}"


# ---------------------------------------------------------------------------------------
# Prometheus alerting rules


def _expr(rule: AlertRule, matchers: str, job: str) -> str:
    """The rule's condition in PromQL; its value is what the annotation reports."""
    t, w = _number(rule.threshold), duration(rule.window_s)
    kind = rule.kind
    if kind is RuleKind.KV_SLOPE:
        # deriv() is the least-squares slope, as the evaluator's fit; per second, so x 60.
        kv = f"avg by ({BY}) ({_gauge('kv_usage', matchers)})"
        finished = _per_second("requests_finished_total", matchers, REQUEST_RATE_RANGE)
        rate = f"(sum by ({BY}) ({finished}))[{w}:]"
        return (
            f"deriv(({kv})[{w}:]) * 60 > {t}\n"
            f"and\nstddev_over_time({rate})\n/\navg_over_time({rate})\n"
            f"<= {_number(rule.stable_rate)}"
        )
    if kind is RuleKind.KV_LEVEL:
        return f"avg by ({BY}) ({_gauge('kv_usage', matchers)}) > {t}"
    if kind is RuleKind.PREEMPTIONS:
        return f"sum by ({BY}) ({_per_second('preemptions_total', matchers, w)}) > {t}"
    if kind is RuleKind.QUEUE_DEPTH:
        return f"sum by ({BY}) ({_gauge('waiting', matchers)}) > {t}"
    if kind is RuleKind.TAIL_RATIO:
        assert rule.metric is not None  # AlertRule refuses a tail_ratio rule without one
        return (
            f"(\n{_tail_ratio(rule.metric, matchers, w)}\n) > {t}\n"
            f"and\n{_observations(rule.metric, matchers, w)} >= {MIN_COUNT}"
        )
    if kind is RuleKind.P99_OVER_SLO:
        assert rule.metric is not None
        return f"{_quantile(0.99, rule.metric, matchers, w)} > {t}"
    if kind is RuleKind.OUTPUT_TAIL:
        now = _quantile(0.99, "output_len", matchers, w)
        before = _quantile(0.99, "output_len", matchers, w, offset=w)
        return (
            f"(\n{now}\n/\n{before}\n) > {t}\n"
            f"and\n{_observations('output_len', matchers, w)} >= {MIN_COUNT}\n"
            f"and\n{_observations('output_len', matchers, w, offset=w)} >= {MIN_COUNT}"
        )
    up = ", ".join(m for m in (f"job={_string(job)}", matchers) if m)
    if kind is RuleKind.TARGET_DOWN:
        return f"up{{{up}}} == 0"
    if kind is RuleKind.ENGINE_RESTARTING:
        # process_start_time_seconds (prometheus_client's process collector) changes value
        # exactly when the server process restarts. Where it is missing (vLLM in
        # multiprocess metrics mode), a reset of a vLLM counter shows the restart instead;
        # `or` keeps one series per instance when both exist.
        resets = _newest([f"resets({s}[{w}])" for s in _selectors("prompt_tokens_total", matchers)])
        return (
            f"max by (instance) (changes(process_start_time_seconds{{{up}}}[{w}])) >= {t}\n"
            f"or\nmax by (instance) ({resets}) >= {t}"
        )
    assert_never(kind)


_VALUE_WORDS: dict[RuleKind, str] = {
    RuleKind.KV_SLOPE: "{{ $value | humanizePercentage }} of the cache per minute",
    RuleKind.KV_LEVEL: "{{ $value | humanizePercentage }} of the KV cache in use",
    RuleKind.PREEMPTIONS: "{{ $value | humanize }} preemptions/s",
    RuleKind.QUEUE_DEPTH: "{{ $value }} requests waiting",
    RuleKind.TAIL_RATIO: "p99/p50 {{ $value | humanize }}",
    RuleKind.P99_OVER_SLO: "p99 {{ $value | humanizeDuration }}",
    RuleKind.OUTPUT_TAIL: "p99 output length {{ $value | humanize }}x the window before",
    RuleKind.TARGET_DOWN: "up is 0",
    RuleKind.ENGINE_RESTARTING: "{{ $value }} restart(s)",
}


def _literal(text: str) -> str:
    """Text shown as is by Prometheus' templating (annotations and labels are templates)."""
    return text.replace("{{", '{{ "{{" }}')


def _sentence(text: str) -> str:
    return f"{text[:1].upper()}{text[1:]}."


def _alert_name(rule: AlertRule) -> str:
    """CamelCase, as Prometheus alerts are usually named: `KvscopeKVCacheNearlyFull`."""
    words = re.findall(r"[A-Za-z0-9]+", rule.name) or rule.kind.value.split("_")
    return "Kvscope" + "".join(w[0].upper() + w[1:] for w in words)


def _alert(rule: AlertRule, job: str, instances: Mapping[str, str]) -> dict[str, Any]:
    instance = instances.get(rule.target) if rule.target else None
    matchers = f"instance={_string(instance)}" if instance else ""
    scope = "watches every instance"
    if rule.target and instance:
        scope = f"watches instance {instance} (kvscope target {rule.target})"
    elif rule.target:
        # A kvscope target name is no Prometheus label; without a mapping the rule can only
        # watch everything, and says so rather than silently narrowing to nothing.
        scope = (
            f"watches every instance: kvscope applies it to target {rule.target} only, "
            "and no instance was given for that target"
        )
    return {
        "alert": _alert_name(rule),
        "expr": _expr(rule, matchers, job),
        "for": duration(rule.for_s),
        "labels": {"severity": rule.severity, "kvscope_rule": _literal(rule.name)},
        "annotations": {
            "summary": _literal(rule.name) + " on {{ $labels.instance }}",
            "description": _literal(f"{_sentence(rule.describe())} ")
            + f"Now {_VALUE_WORDS[rule.kind]}. "
            + _literal(f"kvscope rule {rule.name!r} ({rule.kind.value}) {scope}."),
        },
    }


def prometheus_rules(
    rules: Sequence[AlertRule],
    group: str = "kvscope",
    job: str = "vllm",
    instances: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Prometheus alerting-rules document with one alert per enabled rule.

    `job` is the scrape job of the vLLM servers (for `up` and the process metrics);
    `instances` maps kvscope target names to Prometheus `instance` values, which narrows
    rules that name a target.
    """
    mapping = instances or {}
    return {
        "groups": [{"name": group, "rules": [_alert(r, job, mapping) for r in rules if r.enabled]}]
    }


def prometheus_rules_yaml(
    rules: Sequence[AlertRule],
    group: str = "kvscope",
    job: str = "vllm",
    instances: Mapping[str, str] | None = None,
) -> str:
    """`prometheus_rules` as the YAML file Prometheus' `rule_files` and promtool read."""
    header = "# Prometheus alerting rules exported by kvscope; see docs/exports.md.\n"
    return header + to_yaml(prometheus_rules(rules, group, job, instances))


# ---------------------------------------------------------------------------------------
# A small YAML writer: block style, every string quoted or a literal block, so nothing is
# read back as a number or a boolean. Enough for the rules document, and no dependency.

# Characters to escape in a double-quoted scalar that JSON leaves raw: YAML's non-printable
# ones, and those YAML 1.1 readers take for line breaks (NEL, LS, PS) or a byte-order mark.
_NOT_PRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def _quote(text: str) -> str:
    quoted = json.dumps(text, ensure_ascii=False)  # JSON's escapes are YAML's too
    return _NOT_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def _literal_block_fits(text: str) -> bool:
    """Whether `|-` reproduces the text exactly (its first line sets the indentation)."""
    return (
        "\n" in text
        and not text.startswith((" ", "\n"))
        and not text.endswith("\n")
        and not _NOT_PRINTABLE.search(text)
        and all(ch == "\n" or ch == "\t" or ch >= " " for ch in text)
    )


def _yaml_lines(node: Any, pad: str) -> list[str]:
    if isinstance(node, dict):
        lines = []
        for key, value in node.items():
            head = f"{pad}{key}:"
            if isinstance(value, str) and _literal_block_fits(value):
                lines.append(f"{head} |-")
                lines.extend(f"{pad}  {line}" if line else "" for line in value.split("\n"))
            elif isinstance(value, str):
                lines.append(f"{head} {_quote(value)}")
            elif not value:
                lines.append(f"{head} {'{}' if isinstance(value, dict) else '[]'}")
            else:
                lines.append(head)
                lines.extend(_yaml_lines(value, pad + "  "))
        return lines
    if isinstance(node, list):
        lines = []
        for item in node:
            sub = _yaml_lines(item, pad + "  ")
            sub[0] = f"{pad}- {sub[0][len(pad) + 2 :]}"
            lines.extend(sub)
        return lines
    raise TypeError(f"to_yaml writes mappings, lists and strings, not {type(node).__name__}")


def to_yaml(document: Mapping[str, Any]) -> str:
    """YAML for a document of mappings, lists (of mappings) and strings."""
    return "\n".join(_yaml_lines(dict(document), "")) + "\n"


# ---------------------------------------------------------------------------------------
# Grafana dashboard

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
    kv = f"avg by ({BY}) ({_gauge('kv_usage', _SELECTED)})"
    info = (
        f"topk by (instance) (1, max by (instance, num_gpu_blocks) "
        f'({CACHE_CONFIG}{{instance=~"$instance"}}))'
    )
    return (
        f"(\n  {kv}\n  * on (instance) group_left (num_gpu_blocks)\n  {info}\n)\nor on ({BY})\n{kv}"
    )


def _sum_rate(canonical: str) -> str:
    return f"sum by ({BY}) ({_per_second(canonical, _SELECTED, _RATE)})"


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
                (f"sum by ({BY}) ({_gauge('running', _SELECTED)})", f"running {_LEGEND}"),
                (f"sum by ({BY}) ({_gauge('waiting', _SELECTED)})", f"waiting {_LEGEND}"),
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
            (_quantile(q, h, _SELECTED, "$tail_window"), f"p{round(q * 100)} {_LEGEND}")
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
        (_tail_ratio(h, _SELECTED, "$tail_window"), f"{_SHORT.get(h, h.upper())} {_LEGEND}")
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
