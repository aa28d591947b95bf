"""The Prometheus rules and the Grafana dashboard that kvscope exports.

The rules file must pass `promtool check rules` where promtool is installed (Debian's
`prometheus` package) and always a schema check of our own; where promtool is installed,
`promtool test rules` also runs the queries on V0 and V1 series. The dashboard must load
into grafana-foundation-sdk's Dashboard model without losing a field.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import prometheus
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel

from app.exports import (
    duration,
    grafana_dashboard,
    grafana_dashboard_json,
    prometheus_rules,
    prometheus_rules_yaml,
    to_yaml,
)
from planner.slo import parse_slo
from probes.alerting.rules import DEFAULT_RULES, AlertRule, RuleKind

PROMTOOL = shutil.which("promtool")


def _promtool() -> str:
    """promtool's path. The tests that run it fail without it, as the Prometheus server
    tests do without Prometheus."""
    assert PROMTOOL is not None, (
        "promtool not found: install Debian's prometheus package (.ci/run does)"
    )
    return PROMTOOL


# The promise the burn-rate rules watch: bounds on vLLM's bucket edges (TTFT 2.5, TPOT 0.1).
SLO = parse_slo(
    {"name": "chat", "ttft_s": 2.5, "tpot_s": 0.1, "share": 0.99, "window_s": 30 * 86400}
)

# ---------------------------------------------------------------------------------------
# Our own schema check of a Prometheus rules file (what rulefmt checks, minus PromQL parsing)

_DURATION = re.compile(r"(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
_CLOSING = {"(": ")", "[": "]", "{": "}"}


def _is_duration(value: object) -> bool:
    return isinstance(value, str) and (
        value == "0" or (value != "" and bool(_DURATION.fullmatch(value)))
    )


def _balanced(expr: str) -> bool:
    """Brackets close in order, outside PromQL string literals."""
    stack: list[str] = []
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch in "\"'`":
            end = i + 1
            while end < len(expr) and expr[end] != ch:
                end += 2 if expr[end] == "\\" and ch != "`" else 1
            if end >= len(expr):
                return False
            i = end
        elif ch in _CLOSING:
            stack.append(_CLOSING[ch])
        elif ch in ")]}" and (not stack or stack.pop() != ch):
            return False
        i += 1
    return not stack


def _template_closed(text: str) -> bool:
    """Every `{{` action of a Go template ends with `}}` (quoted strings inside skipped)."""
    i = text.find("{{")
    while i >= 0:
        j, quote = i + 2, ""
        while j < len(text) and (quote or not text.startswith("}}", j)):
            if quote and text[j] == "\\":
                j += 1
            elif text[j] == quote:
                quote = ""
            elif not quote and text[j] in '"`':
                quote = text[j]
            j += 1
        if j >= len(text):
            return False
        i = text.find("{{", j + 2)
    return True


def _string_map(value: object, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where} must be a mapping"]
    errors = []
    for key, val in value.items():
        if not isinstance(key, str) or not _LABEL_NAME.fullmatch(key):
            errors.append(f"{where}: invalid name {key!r}")
        if not isinstance(val, str):
            errors.append(f"{where}.{key}: must be a string, not {type(val).__name__}")
        elif not _template_closed(val):
            errors.append(f"{where}.{key}: unclosed template action")
    return errors


def _rule_errors(rule: object, where: str) -> list[str]:
    if not isinstance(rule, dict):
        return [f"{where} must be a mapping"]
    errors = [f"{where}: unknown field {k!r}" for k in rule if k not in _RULE_KEYS]
    if ("alert" in rule) == ("record" in rule):
        errors.append(f"{where}: exactly one of alert and record")
    name = rule.get("alert", rule.get("record"))
    if not isinstance(name, str) or not name.strip():
        errors.append(f"{where}: empty name")
    expr = rule.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        errors.append(f"{where}: expr must be set")
    elif not _balanced(expr):
        errors.append(f"{where}: unbalanced brackets in expr")
    for field in ("for", "keep_firing_for"):
        if field in rule and not _is_duration(rule[field]):
            errors.append(f"{where}: {field} {rule[field]!r} is not a duration")
    for field in ("labels", "annotations"):
        if field in rule:
            errors.extend(_string_map(rule[field], f"{where}.{field}"))
    return errors


def schema_errors(text: str) -> list[str]:
    """Why a text is not a Prometheus rules file; [] when it is one."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        return [f"not YAML: {err}"]
    if not isinstance(doc, dict) or set(doc) != {"groups"} or not isinstance(doc["groups"], list):
        return ["the top level must be exactly `groups:` with a list"]
    errors: list[str] = []
    names: set[object] = set()
    for g, group in enumerate(doc["groups"]):
        where = f"groups[{g}]"
        if not isinstance(group, dict):
            errors.append(f"{where} must be a mapping")
            continue
        unknown = set(group) - {"name", "interval", "limit", "rules"}
        errors.extend(f"{where}: unknown field {k!r}" for k in sorted(unknown))
        name = group.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f"{where}: name must be set")
        elif name in names:
            errors.append(f"{where}: duplicate group {name!r}")
        names.add(name)
        if "interval" in group and not _is_duration(group["interval"]):
            errors.append(f"{where}: interval is not a duration")
        if not isinstance(group.get("rules"), list):
            errors.append(f"{where}: rules must be a list")
            continue
        for r, rule in enumerate(group["rules"]):
            errors.extend(_rule_errors(rule, f"{where}.rules[{r}]"))
    return errors


def validate_rules_file(path: Path, promtool: str | None) -> list[str]:
    """Our schema check always, and promtool's where it is given."""
    errors = schema_errors(path.read_text())
    if promtool:
        done = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            errors.append(f"promtool: {(done.stdout + done.stderr).strip()}")
    return errors


# ---------------------------------------------------------------------------------------
# The rules file


def _write(tmp_path: Path, text: str, name: str = "rules.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _by_rule(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rule in doc["groups"][0]["rules"]:
        out.setdefault(rule["labels"]["kvscope_rule"], []).append(rule)
    return out


@pytest.mark.parametrize("promtool", [False, True], ids=["schema-only", "schema-and-promtool"])
def test_default_rules_file_is_valid(tmp_path: Path, promtool: bool) -> None:
    path = _write(tmp_path, prometheus_rules_yaml(DEFAULT_RULES, slo=SLO))
    assert validate_rules_file(path, _promtool() if promtool else None) == []


BROKEN = {
    "bad duration": ('for: "1m"', 'for: "1 minute"'),
    "missing expr": ("expr:", "exp_r:"),
    "unknown field": ("labels:", "label:"),
    "unclosed paren": ("(vllm:num_preemptions_total[1m]))", "(vllm:num_preemptions_total[1m])"),
    "unclosed template": ("on {{ $labels.instance }}", "on {{ $labels.instance"),
    "wrong top level": ("groups:", "group:"),
    "not yaml": ("groups:", "groups: ["),
    "empty group name": ('name: "kvscope"', 'name: ""'),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_schema_check_and_promtool_refuse_broken_files(tmp_path: Path, case: str) -> None:
    old, new = BROKEN[case]
    good = prometheus_rules_yaml(DEFAULT_RULES)
    assert old in good
    path = _write(tmp_path, good.replace(old, new, 1))
    assert schema_errors(path.read_text()), f"schema check let {case} through"
    # The check of our own agrees with Prometheus'.
    assert any(e.startswith("promtool:") for e in validate_rules_file(path, _promtool()))


def test_schema_check_refuses_a_label_that_is_not_a_string() -> None:
    doc = prometheus_rules(DEFAULT_RULES)
    doc["groups"][0]["rules"][0]["labels"]["severity"] = 3
    assert any("must be a string" in e for e in schema_errors(yaml.safe_dump(doc)))


def test_every_enabled_rule_appears_once_with_its_settings() -> None:
    rules = list(DEFAULT_RULES)
    rules[2] = rules[2].model_copy(update={"enabled": False})
    by_rule = _by_rule(yaml.safe_load(prometheus_rules_yaml(rules, slo=SLO)))
    assert rules[2].name not in by_rule
    assert len(by_rule) == len(rules) - 1
    for rule in rules[:2] + rules[3:]:
        (exported,) = by_rule[rule.name]
        expr = exported["expr"]
        assert exported["labels"]["severity"] == rule.severity
        assert exported["for"] == duration(rule.for_s)
        assert exported["alert"].startswith("Kvscope") and " " not in exported["alert"]
        assert rule.describe()[1:] in exported["annotations"]["description"]
        if rule.kind is not RuleKind.TARGET_DOWN:  # `up == 0`: up is 0 or 1, no threshold
            threshold = re.escape(repr(rule.threshold).removesuffix(".0"))
            assert re.search(rf"(>|>=) {threshold}(\s|$)", expr), (rule.name, expr)
        if rule.kind not in (RuleKind.KV_LEVEL, RuleKind.QUEUE_DEPTH, RuleKind.TARGET_DOWN):
            assert f"[{duration(rule.window_s)}" in expr, (rule.name, expr)


def test_each_kind_reads_the_right_metrics_in_every_spelling() -> None:
    by_rule = {
        name: rules[0]["expr"] for name, rules in _by_rule(prometheus_rules(DEFAULT_RULES)).items()
    }
    slope = by_rule["KV usage creeping up"]
    assert "deriv(" in slope and "* 60 > 0.02" in slope and "<= 0.2" in slope
    assert "vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc" in slope
    assert "stddev_over_time(" in slope and "vllm:request_success_total" in slope
    assert "__name__" not in "".join(by_rule.values())  # see _newest: rate() would fail
    itl = by_rule["ITL tail drifting from the median"]
    assert "vllm:inter_token_latency_seconds_bucket" in itl
    assert "vllm:time_per_output_token_seconds_bucket" in itl
    assert "histogram_quantile(0.99" in itl and "histogram_quantile(0.5" in itl
    assert "sum by (instance, model_name, le)" in itl and ">= 10" in itl
    tpot = by_rule["TPOT p99 over the SLO"]
    assert "vllm:request_time_per_output_token_seconds_bucket" in tpot
    assert "vllm:time_per_output_token" not in tpot
    assert "vllm:num_preemptions_total[1m]" in by_rule["Preemptions"]
    assert "offset 30m" in by_rule["Output lengths growing"]
    assert "vllm:request_generation_tokens_bucket" in by_rule["Output lengths growing"]
    assert "changes(process_start_time_seconds" in by_rule["Engine restarting"]
    assert "resets(vllm:prompt_tokens_total[15m])" in by_rule["Engine restarting"]


def test_burn_rate_rules_read_the_slos_bounds_at_vllms_bucket_edges() -> None:
    by_rule = {
        name: rules[0]["expr"]
        for name, rules in _by_rule(prometheus_rules(DEFAULT_RULES, slo=SLO)).items()
    }
    fast = by_rule["SLO budget burning fast"]
    # A long and a short window, each: (bad TTFT share + bad TPOT share) / allowance > 14.4.
    assert fast.count("> 14.4") == 2 and "[1h]" in fast and "[5m]" in fast
    assert 'vllm:time_to_first_token_seconds_bucket{le="2.5"}' in fast
    assert 'vllm:request_time_per_output_token_seconds_bucket{le="0.1"}' in fast
    assert ") / 0.01" in fast
    assert "[6h]" in by_rule["SLO budget burning"] and "[30m]" in by_rule["SLO budget burning"]
    # A bound between edges is read at the edge below it (pessimistic); one below every
    # edge cannot be read, and without an SLO there is nothing to burn: both left out, said.
    between = SLO.model_copy(update={"ttft_s": 0.3})
    assert (
        '{le="0.25"}'
        in prometheus_rules(DEFAULT_RULES, slo=between)["groups"][0]["rules"][-1]["expr"]
    )
    tiny = SLO.model_copy(update={"ttft_s": 0.0005})
    tiny_why = "the TTFT bound 0.0005 s is below vLLM's smallest bucket (0.001 s)"
    for promise, why in ((None, "no SLO to burn"), (tiny, tiny_why)):
        text = prometheus_rules_yaml(DEFAULT_RULES, slo=promise)
        assert f"# not exported: 'SLO budget burning fast': {why}" in text
        assert "SLO budget burning" not in _by_rule(yaml.safe_load(text))


def test_job_is_a_parameter() -> None:
    rules = _by_rule(prometheus_rules(DEFAULT_RULES, job="llm-servers"))
    assert rules["Target down"][0]["expr"] == 'up{job="llm-servers"} == 0'
    assert 'process_start_time_seconds{job="llm-servers"}' in rules["Engine restarting"][0]["expr"]


def test_a_target_narrows_only_with_an_instance_mapping() -> None:
    rules = [
        r.model_copy(update={"target": "gpu-a"})
        for r in DEFAULT_RULES
        if r.kind in (RuleKind.KV_LEVEL, RuleKind.TARGET_DOWN, RuleKind.TAIL_RATIO)
    ]
    wide = _by_rule(prometheus_rules(rules))
    for (exported,) in wide.values():
        assert "instance=" not in exported["expr"]
        assert "target gpu-a only" in exported["annotations"]["description"]
    narrow = _by_rule(prometheus_rules(rules, instances={"gpu-a": "10.0.0.5:8000"}))
    for (exported,) in narrow.values():
        expr = exported["expr"]
        selectors = re.findall(r"(?:vllm:\w+|\bup\b)(\{[^}]*\})?", expr)
        assert selectors and all('instance="10.0.0.5:8000"' in s for s in selectors), expr
        assert "watches instance 10.0.0.5:8000" in exported["annotations"]["description"]


@pytest.mark.parametrize("promtool", [False, True], ids=["schema-only", "schema-and-promtool"])
def test_a_rule_with_labels_narrows_by_those_labels(tmp_path: Path, promtool: bool) -> None:
    rules = [
        r.model_copy(update={"labels": {"pool": "chat", "region": "eu"}})
        for r in DEFAULT_RULES
        if r.kind in (RuleKind.KV_LEVEL, RuleKind.TARGET_DOWN, RuleKind.TAIL_RATIO)
    ]
    for (exported,) in _by_rule(prometheus_rules(rules)).values():
        selectors = re.findall(r"(?:vllm:\w+|\bup\b)(\{[^}]*\})?", exported["expr"])
        assert selectors and all('pool="chat",region="eu"' in s for s in selectors), exported
        assert "instances labelled pool=chat, region=eu" in exported["annotations"]["description"]
    path = tmp_path / "rules.yaml"
    path.write_text(prometheus_rules_yaml(rules))
    assert validate_rules_file(path, _promtool() if promtool else None) == []


def test_durations() -> None:
    assert [duration(s) for s in (600, 90, 0.25, 0, 30, 86400 + 3600, 1800.5)] == [
        "10m",
        "1m30s",
        "250ms",
        "0s",
        "30s",
        "1d1h",
        "30m500ms",
    ]
    assert all(_is_duration(duration(s)) for s in (1, 59.999, 7 * 86400))


NASTY_NAMES = [
    'quote " and backslash \\ here',
    "template {{ $value }} and {{{ triple",
    "unicode: é ü 東京 ✓",
    "control \x7f and \x85 and tab\tin",
    "yes",  # a YAML 1.1 boolean when unquoted
    "multi\nline",
]


def test_yaml_writer_round_trips_what_users_type(tmp_path: Path) -> None:
    rules = [
        AlertRule(name=name, kind=RuleKind.QUEUE_DEPTH, threshold=i, target=name)
        for i, name in enumerate(NASTY_NAMES)
    ]
    text = prometheus_rules_yaml(rules)
    assert yaml.safe_load(text) == prometheus_rules(rules)
    # Annotations and labels are Go templates: a name with `{{` must still read as itself.
    assert validate_rules_file(_write(tmp_path, text), _promtool()) == []
    assert yaml.safe_load(to_yaml({"a": [], "b": {}, "c": "x\n  y", "d": " lead\nx"})) == {
        "a": [],
        "b": {},
        "c": "x\n  y",
        "d": " lead\nx",
    }


def test_no_enabled_rule_still_makes_a_valid_file(tmp_path: Path) -> None:
    off = [r.model_copy(update={"enabled": False}) for r in DEFAULT_RULES]
    text = prometheus_rules_yaml(off, group="empty")
    assert yaml.safe_load(text) == {"groups": [{"name": "empty", "rules": []}]}
    assert validate_rules_file(_write(tmp_path, text), _promtool()) == []


# ---------------------------------------------------------------------------------------
# promtool test rules: the queries on V0, V1 and deprecation-window (both names) series

STEP_S = 15
STEPS = 80  # 20 minutes of samples
LABELS = {"job": "vllm", "model_name": "m"}


def _series(name: str, labels: dict[str, str], values: Iterable[float]) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": " ".join(repr(float(v)) for v in values)}


def _flat(value: float, steps: int = STEPS) -> list[float]:
    return [value] * (steps + 1)


def _counter(per_step: float, steps: int = STEPS) -> list[float]:
    return [i * per_step for i in range(steps + 1)]


def _histogram(
    base: str, labels: dict[str, str], per_step: Sequence[tuple[str, float]], steps: int = STEPS
) -> list[dict[str, str]]:
    """Buckets (cumulative `le` counts, each growing by its share per step) and _count."""
    out, total = [], 0.0
    for le, count in per_step:
        total += count
        out.append(_series(f"{base}_bucket", {**labels, "le": le}, _counter(total, steps)))
    out.append(_series(f"{base}_bucket", {**labels, "le": "+Inf"}, _counter(total, steps)))
    out.append(_series(f"{base}_count", labels, _counter(total, steps)))
    return out


def _instance(name: str, **extra: str) -> dict[str, str]:
    return {**LABELS, "instance": name, **extra}


V1, V0, BOTH, CALM = "v1:8000", "v0:8000", "both:8000", "calm:8000"
KV_NAMES = {V1: ["vllm:kv_cache_usage_perc"], V0: ["vllm:gpu_cache_usage_perc"]}
KV_NAMES[BOTH] = KV_NAMES[V1] + KV_NAMES[V0]
ITL_NAMES = {
    V1: ["vllm:inter_token_latency_seconds"],
    V0: ["vllm:time_per_output_token_seconds"],
}
ITL_NAMES[BOTH] = ITL_NAMES[V1] + ITL_NAMES[V0]
PREFIX = {
    V1: ["vllm:prefix_cache_{}_total"],
    V0: ["vllm:gpu_prefix_cache_{}_total"],
}
PREFIX[BOTH] = PREFIX[V1] + PREFIX[V0]
SKEWED = [("0.01", 9.0), ("0.1", 0.0), ("1", 1.0)]  # p50 0.0056 s, p99 0.91 s
TIGHT = [("0.01", 10.0)]  # p50 0.005 s, p99 0.0099 s


def _engine_series() -> list[dict[str, str]]:
    """Three busy engines (V1 names, V0 names, both during a deprecation), one calm one,
    one whose KV usage creeps up at a steady request rate and one where the rate jumps."""
    series: list[dict[str, str]] = []
    for inst in (V1, V0, BOTH):
        labels = _instance(inst, engine="0") if inst != V0 else _instance(inst)
        series += [_series(name, labels, _flat(0.95)) for name in KV_NAMES[inst]]
        series.append(_series("vllm:num_preemptions_total", labels, _counter(1)))
        for name in ITL_NAMES[inst]:
            series += _histogram(name, labels, SKEWED)
        for name in PREFIX[inst]:
            series.append(_series(name.format("hits"), labels, _counter(5)))
            series.append(_series(name.format("queries"), labels, _counter(10)))
    calm = _instance(CALM)
    series += [
        _series("vllm:kv_cache_usage_perc", calm, _flat(0.3)),
        _series("vllm:num_preemptions_total", calm, _flat(7)),
        *_histogram("vllm:inter_token_latency_seconds", calm, TIGHT),
    ]
    series += _histogram("vllm:time_to_first_token_seconds", _instance(V1), [("1", 0), ("5", 4)])
    series.append(_series("vllm:num_requests_waiting", _instance(V0), _flat(10)))
    series.append(_series("vllm:num_requests_waiting", _instance(V1), _flat(4)))
    # KV usage +0.03 of the cache per minute; 1 request/s, then (jumpy) 2/s and 0.2/s.
    creep = [0.1 + 0.0075 * i for i in range(STEPS + 1)]
    jumpy = [0.0]
    for i in range(STEPS):
        jumpy.append(jumpy[-1] + (30 if (i // 8) % 2 else 3))
    for inst, finished in (("creep:8000", _counter(15)), ("jumpy:8000", jumpy)):
        series.append(_series("vllm:kv_cache_usage_perc", _instance(inst), creep))
        labels = _instance(inst, finished_reason="stop")
        series.append(_series("vllm:request_success_total", labels, finished))
    # Scrape health and restarts: V1 restarts at 10 min (its process start time and its
    # counters both show it); V0 has no process metrics (multiprocess mode), only a reset.
    half = STEPS // 2
    for inst, up in ((V1, 1), (V0, 0), (CALM, 1)):
        series.append(_series("up", {"job": "vllm", "instance": inst}, _flat(up)))
    series.append(_series("up", {"job": "node", "instance": "other:9100"}, _flat(0)))
    start = {"job": "vllm", "instance": V1}
    series.append(
        _series("process_start_time_seconds", start, [1e9] * half + [1e9 + 600] * (half + 1))
    )
    calm_start = {"job": "vllm", "instance": CALM}
    series.append(_series("process_start_time_seconds", calm_start, _flat(1e9)))
    restarted = _counter(100, half - 1) + _counter(100, half + 1)
    for inst in (V1, V0):
        series.append(_series("vllm:prompt_tokens_total", _instance(inst), restarted))
    series.append(_series("vllm:prompt_tokens_total", calm, _counter(100)))
    return series


def _alert(rule: str, **labels: str) -> dict[str, str]:
    """The labels an alert of a default rule carries (promtool adds `alertname`)."""
    severity = next(r.severity for r in DEFAULT_RULES if r.name == rule)
    return {**labels, "severity": severity, "kvscope_rule": rule}


def _promtool_test(
    tmp_path: Path,
    rules: dict[str, Any],
    tests: list[dict[str, Any]],
    keep_annotations: bool = False,
) -> None:
    """Run `promtool test rules`; JSON is YAML, so the unit-test file is written as JSON.

    Annotations (which carry rendered values) are dropped unless a test expects them."""
    for group in [] if keep_annotations else rules["groups"]:
        for rule in group["rules"]:
            rule["annotations"] = {}
    rules_path = _write(tmp_path, to_yaml(rules))
    spec = {"rule_files": [str(rules_path)], "evaluation_interval": f"{STEP_S}s", "tests": tests}
    test_path = _write(tmp_path, json.dumps(spec, indent=1), "test.json")
    done = subprocess.run(
        [_promtool(), "test", "rules", str(test_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _alert_tests(expected: dict[str, list[dict[str, str]]], at: str) -> list[dict[str, Any]]:
    """promtool's alert_rule_test entries: which alerts of each rule fire at `at`."""
    names = {
        name: rules[0]["alert"] for name, rules in _by_rule(prometheus_rules(DEFAULT_RULES)).items()
    }
    return [
        {
            "eval_time": at,
            "alertname": names[rule],
            "exp_alerts": [{"exp_labels": a} for a in alerts],
        }
        for rule, alerts in expected.items()
    ]


def test_alerts_fire_on_v0_and_v1_spellings(tmp_path: Path) -> None:
    def per_engine(rule: str) -> list[dict[str, str]]:
        return [_alert(rule, instance=i, model_name="m") for i in (V1, V0, BOTH)]

    expected = {
        "KV cache nearly full": per_engine("KV cache nearly full"),
        "Preemptions": per_engine("Preemptions"),
        "ITL tail drifting from the median": per_engine("ITL tail drifting from the median"),
        "TTFT p99 over the SLO": [_alert("TTFT p99 over the SLO", instance=V1, model_name="m")],
        "Requests queueing": [_alert("Requests queueing", instance=V0, model_name="m")],
        "KV usage creeping up": [
            _alert("KV usage creeping up", instance="creep:8000", model_name="m")
        ],
        "Target down": [_alert("Target down", instance=V0, job="vllm")],
        "Engine restarting": [
            _alert("Engine restarting", instance=V1),
            _alert("Engine restarting", instance=V0),
        ],
        "TTFT tail drifting from the median": [],
        "TPOT p99 over the SLO": [],
    }
    tests = [
        {
            "interval": f"{STEP_S}s",
            "input_series": _engine_series(),
            "alert_rule_test": _alert_tests(expected, "20m"),
        }
    ]
    _promtool_test(tmp_path, prometheus_rules(DEFAULT_RULES), tests)


def test_alerts_stay_quiet_before_their_for_duration(tmp_path: Path) -> None:
    expected: dict[str, list[dict[str, str]]] = {
        "KV cache nearly full": [],  # holds from the start; fires after its 1 min
        "KV usage creeping up": [],  # holds from about 30 s; fires after its 2 min
        "ITL tail drifting from the median": [],  # 5 min
    }
    tests = [
        {
            "interval": f"{STEP_S}s",
            "input_series": _engine_series(),
            "alert_rule_test": _alert_tests(expected, "45s"),
        }
    ]
    _promtool_test(tmp_path, prometheus_rules(DEFAULT_RULES), tests)


def test_output_tail_compares_with_the_window_before(tmp_path: Path) -> None:
    steps, half = 280, 140  # 70 minutes; outputs ten times longer after 35
    series: list[dict[str, str]] = []
    for inst, grows in (("grows:8000", True), ("same:8000", False)):
        labels = _instance(inst)
        short = [i * 10.0 for i in range(half + 1)]
        long_ = [short[-1] + i * 10.0 for i in range(1, steps - half + 1)]
        zeros_after = [short[-1]] * (steps - half)
        cum = {"100": short + (zeros_after if grows else long_), "1000": short + long_}
        for le, values in (*cum.items(), ("+Inf", short + long_)):
            series.append(
                _series("vllm:request_generation_tokens_bucket", {**labels, "le": le}, values)
            )
        series.append(_series("vllm:request_generation_tokens_count", labels, short + long_))
    rule = next(r for r in DEFAULT_RULES if r.kind is RuleKind.OUTPUT_TAIL)
    expected = {rule.name: [_alert(rule.name, instance="grows:8000", model_name="m")]}
    tests = [
        {
            "interval": f"{STEP_S}s",
            "input_series": series,
            "alert_rule_test": _alert_tests(expected, "65m"),
        }
    ]
    _promtool_test(tmp_path, prometheus_rules([rule]), tests)


# ---------------------------------------------------------------------------------------
# The Grafana dashboard

GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$tail_window": "5m",
    "$model_name": ".*",
    "$instance": ".*",
}


def _as_promql(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def _timeseries(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in model["panels"] if p["type"] == "timeseries"]


def _fields_lost(mine: Any, theirs: Any, path: str = "") -> list[str]:
    """Paths in `mine` that the SDK's re-serialisation dropped or changed."""
    if isinstance(mine, dict):
        if not isinstance(theirs, dict):
            return [path]
        return [
            p for k, v in mine.items() for p in _fields_lost(v, theirs.get(k, ...), f"{path}/{k}")
        ]
    if isinstance(mine, list):
        if not isinstance(theirs, list) or len(theirs) != len(mine):
            return [path]
        return [
            p
            for i, (a, b) in enumerate(zip(mine, theirs, strict=True))
            for p in _fields_lost(a, b, f"{path}[{i}]")
        ]
    return [] if mine == theirs else [path]


def test_dashboard_loads_into_the_grafana_sdk_model_without_losing_a_field() -> None:
    register_default_plugins()
    model = json.loads(grafana_dashboard_json())
    dashboard = Dashboard.from_json(model)
    assert dashboard.title == "kvscope: vLLM live and tail" and dashboard.uid == "kvscope-vllm"
    panels = dashboard.panels or []
    assert [type(p) for p in panels].count(RowPanel) == 2
    for panel in panels:
        if isinstance(panel, Panel):
            assert panel.type_val == "timeseries" and panel.grid_pos is not None
            assert panel.targets and all(
                isinstance(t, prometheus.Dataquery) and t.expr for t in panel.targets
            )
    back = json.loads(json.dumps(dashboard, cls=JSONEncoder))
    # `__inputs` is import metadata for Grafana's Import screen, not part of the model.
    assert _fields_lost(model, back) == ["/__inputs"]


def test_dashboard_structure() -> None:
    model = grafana_dashboard()
    assert model["schemaVersion"] >= 39 and model["uid"] and model["title"]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in model["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & occupied, f"panel {panel['id']} overlaps another"
        occupied |= cells
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource"
        and variables["datasource"]["query"] == "prometheus"
    )
    assert {"model_name", "instance"} <= set(variables)
    for panel in _timeseries(model):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["legendFormat"]
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= set(variables) | {"__rate_interval"}, used
            assert 'model_name=~"$model_name"' in target["expr"]
    titles = [p["title"] for p in _timeseries(model)]
    assert titles[:6] == [
        "KV cache usage",
        "Requests in the engine",
        "Preemptions",
        "Tokens per second",
        "Prefix cache hit rate",
        "Finished requests",
    ]
    tail = " ".join(titles[6:])
    for name in (
        "Time to first token",
        "Inter-token latency",
        "Time per output token",
        "End-to-end",
        "Queue time",
        "p99 / p50",
    ):
        assert name in tail


def test_dashboard_datasource_placeholder_or_uid() -> None:
    imported = grafana_dashboard()
    assert imported["__inputs"][0]["name"] == "DS_PROMETHEUS"
    assert imported["templating"]["list"][0]["current"]["value"] == "${DS_PROMETHEUS}"
    provisioned = grafana_dashboard(datasource_uid="prom-main", title="LLM fleet")
    assert "__inputs" not in provisioned and provisioned["title"] == "LLM fleet"
    assert provisioned["templating"]["list"][0]["current"]["value"] == "prom-main"


def test_dashboard_queries_are_promql(tmp_path: Path) -> None:
    """Every query, variables filled in, as a recording rule: promtool parses it, and our
    schema check at least balances its brackets."""
    exprs = [_as_promql(t["expr"]) for p in _timeseries(grafana_dashboard()) for t in p["targets"]]
    doc = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"kvscope:q{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    assert validate_rules_file(_write(tmp_path, to_yaml(doc)), _promtool()) == []


def test_dashboard_queries_read_v0_and_v1_engines(tmp_path: Path) -> None:
    model = grafana_dashboard()
    query = {p["title"]: [_as_promql(t["expr"]) for t in p["targets"]] for p in _timeseries(model)}
    series = _engine_series()
    info = {"block_size": "16", "num_gpu_blocks": "1000"}
    series.append(
        _series(
            "vllm:cache_config_info",
            {"job": "vllm", "instance": V1, "engine": "0", **info},
            _flat(1),
        )
    )
    series.append(
        _series("vllm:cache_config_info", {"job": "vllm", "instance": V0, **info}, _flat(1))
    )

    def near(expr: str, value: float, samples: list[dict[str, str]]) -> dict[str, Any]:
        # promtool compares floats exactly; `abs(x - v) < bool e` is 1 where x is near v.
        return {
            "expr": f"abs(({expr}) - {value}) < bool 1e-6",
            "eval_time": "20m",
            "exp_samples": [{"labels": lbl, "value": 1} for lbl in [s["labels"] for s in samples]],
        }

    def at(inst: str, extra: str = "") -> dict[str, str]:
        return {"labels": f'{{instance="{inst}", model_name="m"{extra}}}'}

    blocks = ', num_gpu_blocks="1000"'
    kv = query["KV cache usage"][0]
    hits = query["Prefix cache hit rate"][0]
    itl_p99 = query["Inter-token latency p50 / p95 / p99"][2]
    tests = [
        {
            "interval": f"{STEP_S}s",
            "input_series": series,
            "promql_expr_test": [
                near(f"({kv}) > 0.9", 0.95, [at(V1, blocks), at(V0, blocks), at(BOTH)]),
                near(hits, 0.5, [at(V1), at(V0), at(BOTH)]),
                near(f"({itl_p99}) > 0.5", 0.91, [at(V1), at(V0), at(BOTH)]),
            ],
        }
    ]
    _promtool_test(tmp_path, {"groups": []}, tests)


def test_a_name_with_template_braces_shows_as_typed(tmp_path: Path) -> None:
    name = 'Queue {{ $x }} "q"'
    rule = AlertRule(name=name, kind=RuleKind.QUEUE_DEPTH, threshold=4, for_s=0)
    doc = prometheus_rules([rule])
    waiting = _series("vllm:num_requests_waiting", _instance(V0), _flat(10, 8))
    fired = {
        "exp_labels": {
            "instance": V0,
            "model_name": "m",
            "severity": "warning",
            "kvscope_rule": name,
        },
        "exp_annotations": {
            "summary": f"{name} on {V0}",
            "description": "More than 4 requests waiting. Now 10 requests waiting. "
            f"kvscope rule {name!r} (queue_depth) watches every instance.",
        },
    }
    test = {"eval_time": "1m", "alertname": "KvscopeQueueXQ", "exp_alerts": [fired]}
    tests = [{"interval": f"{STEP_S}s", "input_series": [waiting], "alert_rule_test": [test]}]
    _promtool_test(tmp_path, doc, tests, keep_annotations=True)


def test_relative_rules_export_and_pass_promtool(tmp_path: Path) -> None:
    queue = next(r for r in DEFAULT_RULES if r.kind is RuleKind.QUEUE_DEPTH)
    tail = next(r for r in DEFAULT_RULES if r.kind is RuleKind.TAIL_RATIO)
    relative = [
        queue.model_copy(
            update={"name": "Queue per running", "per_running": True, "threshold": 0.5}
        ),
        tail.model_copy(update={"name": "Tail off its usual", "baseline_s": 86400.0}),
    ]
    text = prometheus_rules_yaml(relative)
    by_rule = {name: rules[0]["expr"] for name, rules in _by_rule(yaml.safe_load(text)).items()}
    assert (
        "clamp_min(sum by (instance, model_name) (vllm:num_requests_running), 1)"
        in by_rule["Queue per running"]
    )
    usual = by_rule["Tail off its usual"]
    assert "> 1.5 * (" in usual and "[1d]" in usual and "[5m]" in usual
    assert validate_rules_file(_write(tmp_path, text), _promtool()) == []
