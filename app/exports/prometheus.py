"""kvscope's alert rules as a Prometheus alerting-rules file, for teams that already scrape
vLLM with Prometheus.

One alert per enabled rule; each expression says what kvscope's own evaluator checks
(probes/alerting/evaluate.py), within the limits docs/exports.md lists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, assert_never

from app.exports.promql import (
    BUCKET_EDGES,
    BY,
    duration,
    edge_at_or_below,
    gauge,
    newest,
    number,
    observations,
    per_second,
    quantile,
    selectors,
    share_within,
    string,
    tail_ratio,
)
from app.exports.yamlout import to_yaml
from planner.slo import SLO
from probes.alerting.rules import MIN_COUNT, AlertRule, RuleKind

# The request-rate resolution the kv_slope steadiness test looks at (the evaluator's 60 s).
REQUEST_RATE_RANGE = "1m"


def _burn(slo: SLO, matchers: str, window_s: float) -> str:
    """Burn rate of the SLO's budget over a window: the bad share over the allowance. The
    bad share is TTFT's plus the per-token's, each read at the bucket edge at or below its
    bound: the pessimistic reading, as kvscope's SLOs page (docs/exports.md)."""
    w = duration(window_s)
    bad = []
    for metric, bound in (("ttft", slo.ttft_s), (slo.per_token, slo.tpot_s)):
        edge = edge_at_or_below(metric, bound)
        assert edge is not None  # burn_edges() refused the rule otherwise
        bad.append(f"(1 - (\n{share_within(metric, edge, matchers, w)}\n))")
    return f"(\n{' + '.join(bad)}\n) / {number(slo.allowance)}"


def burn_edges(slo: SLO) -> str | None:
    """Why the SLO's bounds cannot be read from vLLM's buckets (a bound below the smallest
    edge), or None when they can."""
    for metric, bound in (("ttft", slo.ttft_s), (slo.per_token, slo.tpot_s)):
        if edge_at_or_below(metric, bound) is None:
            smallest = BUCKET_EDGES[metric][0]
            return (
                f"the {metric.upper()} bound {bound:g} s is below vLLM's smallest bucket "
                f"({smallest} s)"
            )
    return None


def _expr(rule: AlertRule, matchers: str, job: str, slo: SLO | None = None) -> str:
    """The rule's condition in PromQL; its value is what the annotation reports."""
    t, w = number(rule.threshold), duration(rule.window_s)
    kind = rule.kind
    if kind is RuleKind.KV_SLOPE:
        # deriv() is the least-squares slope, as the evaluator's fit; per second, so x 60.
        kv = f"avg by ({BY}) ({gauge('kv_usage', matchers)})"
        finished = per_second("requests_finished_total", matchers, REQUEST_RATE_RANGE)
        rate = f"(sum by ({BY}) ({finished}))[{w}:]"
        return (
            f"deriv(({kv})[{w}:]) * 60 > {t}\n"
            f"and\nstddev_over_time({rate})\n/\navg_over_time({rate})\n"
            f"<= {number(rule.stable_rate)}"
        )
    if kind is RuleKind.KV_LEVEL:
        return f"avg by ({BY}) ({gauge('kv_usage', matchers)}) > {t}"
    if kind is RuleKind.PREEMPTIONS:
        return f"sum by ({BY}) ({per_second('preemptions_total', matchers, w)}) > {t}"
    if kind is RuleKind.QUEUE_DEPTH:
        waiting = f"sum by ({BY}) ({gauge('waiting', matchers)})"
        if rule.per_running:
            running = f"sum by ({BY}) ({gauge('running', matchers)})"
            return f"{waiting}\n/\nclamp_min({running}, 1)\n> {t}"
        return f"{waiting} > {t}"
    if kind is RuleKind.TAIL_RATIO:
        assert rule.metric is not None  # AlertRule refuses a tail_ratio rule without one
        ratio = f"(\n{tail_ratio(rule.metric, matchers, w)}\n)"
        expr = f"{ratio} > {t}\nand\n{observations(rule.metric, matchers, w)} >= {MIN_COUNT}"
        if rule.baseline_s is None:
            return expr
        b = duration(rule.baseline_s)
        usual = f"(\n{tail_ratio(rule.metric, matchers, b)}\n)"
        return (
            f"{expr}\nand\n{ratio} > {number(rule.baseline_factor)} * {usual}\n"
            f"and\n{observations(rule.metric, matchers, b)} >= {MIN_COUNT}"
        )
    if kind is RuleKind.P99_OVER_SLO:
        assert rule.metric is not None
        return f"{quantile(0.99, rule.metric, matchers, w)} > {t}"
    if kind is RuleKind.OUTPUT_TAIL:
        now = quantile(0.99, "output_len", matchers, w)
        before = quantile(0.99, "output_len", matchers, w, offset=w)
        return (
            f"(\n{now}\n/\n{before}\n) > {t}\n"
            f"and\n{observations('output_len', matchers, w)} >= {MIN_COUNT}\n"
            f"and\n{observations('output_len', matchers, w, offset=w)} >= {MIN_COUNT}"
        )
    if kind is RuleKind.SLO_BURN:
        assert slo is not None  # prometheus_rules() leaves the rule out without an SLO
        long, short = _burn(slo, matchers, rule.window_s), _burn(slo, matchers, rule.short_window_s)
        return f"{long}\n> {t}\nand\n{short}\n> {t}"
    up = ", ".join(m for m in (f"job={string(job)}", matchers) if m)
    if kind is RuleKind.TARGET_DOWN:
        return f"up{{{up}}} == 0"
    if kind is RuleKind.ENGINE_RESTARTING:
        # process_start_time_seconds (prometheus_client's process collector) changes value
        # exactly when the server process restarts. Where it is missing (vLLM in
        # multiprocess metrics mode), a reset of a vLLM counter shows the restart instead;
        # `or` keeps one series per instance when both exist.
        resets = newest([f"resets({s}[{w}])" for s in selectors("prompt_tokens_total", matchers)])
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
    RuleKind.SLO_BURN: "burn rate {{ $value | humanize }}x",
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


def _alert(
    rule: AlertRule, job: str, instances: Mapping[str, str], slo: SLO | None
) -> dict[str, Any]:
    instance = instances.get(rule.target) if rule.target else None
    # Label-scoped rules keep their labels as matchers: the series must carry the same
    # labels in Prometheus (relabel them onto the vLLM targets there).
    parts = [f"instance={string(instance)}"] if instance else []
    parts += [f"{k}={string(v)}" for k, v in sorted(rule.labels.items())]
    matchers = ",".join(parts)
    scope = "watches every instance"
    if rule.labels:
        pairs = ", ".join(f"{k}={v}" for k, v in sorted(rule.labels.items()))
        scope = f"watches the instances labelled {pairs}"
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
        "expr": _expr(rule, matchers, job, slo),
        "for": duration(rule.for_s),
        "labels": {"severity": rule.severity, "kvscope_rule": _literal(rule.name)},
        "annotations": {
            "summary": _literal(rule.name) + " on {{ $labels.instance }}",
            "description": _literal(f"{_sentence(rule.describe())} ")
            + f"Now {_VALUE_WORDS[rule.kind]}. "
            + _literal(f"kvscope rule {rule.name!r} ({rule.kind.value}) {scope}."),
        },
    }


def left_out(rules: Sequence[AlertRule], slo: SLO | None) -> dict[str, str]:
    """Enabled rules the export cannot write, by name, with why: a burn-rate rule needs an
    SLO whose bounds vLLM's buckets can read."""
    out = {}
    for rule in rules:
        if rule.enabled and rule.kind is RuleKind.SLO_BURN:
            why = "no SLO to burn: pass one (the SLOs page's)" if slo is None else burn_edges(slo)
            if why:
                out[rule.name] = why
    return out


def prometheus_rules(
    rules: Sequence[AlertRule],
    group: str = "kvscope",
    job: str = "vllm",
    instances: Mapping[str, str] | None = None,
    slo: SLO | None = None,
) -> dict[str, Any]:
    """A Prometheus alerting-rules document with one alert per enabled rule.

    `job` is the scrape job of the vLLM servers (for `up` and the process metrics);
    `instances` maps kvscope target names to Prometheus `instance` values, which narrows
    rules that name a target; `slo` is the promise the burn-rate rules watch (without it,
    they are left out: `left_out` says which).
    """
    mapping = instances or {}
    skip = left_out(rules, slo)
    alerts = [_alert(r, job, mapping, slo) for r in rules if r.enabled and r.name not in skip]
    return {"groups": [{"name": group, "rules": alerts}]}


def prometheus_rules_yaml(
    rules: Sequence[AlertRule],
    group: str = "kvscope",
    job: str = "vllm",
    instances: Mapping[str, str] | None = None,
    slo: SLO | None = None,
) -> str:
    """`prometheus_rules` as the YAML file Prometheus' `rule_files` and promtool read; the
    rules left out are named in its header."""
    header = "# Prometheus alerting rules exported by kvscope; see docs/exports.md.\n"
    for name, why in left_out(rules, slo).items():
        header += f"# not exported: {name!r}: {why}\n"
    return header + to_yaml(prometheus_rules(rules, group, job, instances, slo))
