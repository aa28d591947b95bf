"""Alerts page: what is firing, the rules (editable), history, and the exports for
Prometheus and Grafana."""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from app import common
from app.exports import grafana_dashboard_json, prometheus_rules_yaml
from planner.errors import KvscopeError
from planner.slo import SLO, parse_slo
from probes.alerting import changes
from probes.alerting.rules import DEFAULT_RULES, ParsedRules, RuleKind, rules_from_rows
from storage import queries
from storage.access import Action, allowed
from storage.schemas import parse_labels


def render() -> None:
    """Draw the page."""
    st.title("Alerts")
    common.worker_banner()
    store = common.store()
    _open()
    rules = queries.list_rules(store)
    parsed = rules_from_rows(rules)
    st.subheader("Rules")
    st.dataframe(
        pd.DataFrame([_rule_row(rid, data, parsed) for rid, data in rules]),
        hide_index=True,
        width="stretch",
    )
    missing = {r.name for r in DEFAULT_RULES} - {data["name"] for _, data in rules}
    can_restore = missing and allowed(common.actor(), Action.RULES_RESTORE)
    label = f"Restore the {len(missing)} missing default rule(s)"
    if can_restore and st.button(label, key="rules_restore"):
        changes.restore_default_rules(store, common.actor())
        st.rerun()
    if allowed(common.actor(), Action.RULE_SAVE):
        with st.expander("Change, add or remove a rule"):
            _editor(rules)
    _history()
    _exports(parsed)


@st.fragment(run_every=5.0)
@common.error_boundary
def _open() -> None:
    firing = queries.open_alerts(common.store())
    st.subheader(f"Firing now ({len(firing)})")
    if not firing:
        st.caption("Nothing is firing.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "severity": a.severity,
                    "rule": a.rule,
                    "target": a.target,
                    "since": common.age(a.started_at),
                    "value": a.value,
                    "message": a.message,
                    "acknowledged": a.acknowledged_by or "",
                }
                for a in firing
            ]
        ),
        hide_index=True,
        width="stretch",
    )
    waiting = [a for a in firing if a.acknowledged_by is None]
    if waiting and allowed(common.actor(), Action.ALERT_ACKNOWLEDGE):
        c1, c2 = st.columns([4, 1])
        pick = c1.selectbox(
            "Acknowledge",
            waiting,
            format_func=lambda a: f"{a.rule} on {a.target}",
            key="ack_pick",
            label_visibility="collapsed",
        )
        if c2.button("Acknowledge", key="ack_btn"):
            changes.acknowledge_alert(common.store(), common.actor(), pick.id)
            st.rerun()


def _rule_row(rule_id: int, data: dict[str, Any], parsed: ParsedRules) -> dict[str, Any]:
    rule = parsed.valid.get(rule_id)
    words = rule.describe() if rule is not None else f"invalid: {parsed.invalid[rule_id]}"
    return {
        "id": rule_id,
        "name": data["name"],
        "enabled": data.get("enabled", True),
        "severity": data.get("severity"),
        "condition": words,
        "for": f"{data.get('for_s', 0):g} s",
        "target": data.get("target") or "every",
        "labels": ", ".join(f"{k}={v}" for k, v in sorted((data.get("labels") or {}).items())),
    }


def _editor(rules: list[tuple[int, dict[str, Any]]]) -> None:
    store = common.store()
    choices: list[tuple[int | None, dict[str, Any]]] = [(None, {}), *rules]
    pick = st.selectbox(
        "Rule",
        choices,
        key="rule_pick",
        format_func=lambda r: "(a new rule)" if r[0] is None else r[1]["name"],
    )
    rule_id, data = pick
    kinds = [k.value for k in RuleKind]
    with st.form("rule_form"):
        c = st.columns(3)
        name = c[0].text_input("Name", data.get("name", ""))
        kind = c[1].selectbox("Kind", kinds, index=kinds.index(data.get("kind", "kv_level")))
        severity = c[2].selectbox(
            "Severity",
            ["info", "warning", "critical"],
            index=["info", "warning", "critical"].index(data.get("severity", "warning")),
        )
        d = st.columns(4)
        threshold = d[0].number_input(
            "Threshold", value=float(data.get("threshold", 0.9)), format="%.4g"
        )
        for_s = d[1].number_input("For (s)", min_value=0.0, value=float(data.get("for_s", 60)))
        window_s = d[2].number_input(
            "Window (s)", min_value=1.0, value=float(data.get("window_s", 300))
        )
        metric = d[3].selectbox(
            "Metric",
            [None, "ttft", "itl", "tpot"],
            index=[None, "ttft", "itl", "tpot"].index(data.get("metric")),
        )
        targets = [None, *[t.name for t in common.targets(common.db_url())]]
        target = st.selectbox(
            "Target",
            targets,
            index=targets.index(data.get("target")) if data.get("target") in targets else 0,
            format_func=lambda t: "every target" if t is None else t,
        )
        labels = st.text_input(
            "Only targets labelled",
            ", ".join(f"{k}={v}" for k, v in sorted((data.get("labels") or {}).items())),
            placeholder="pool=chat, region=eu",
            help="the rule watches only the targets carrying all these labels",
        )
        e = st.columns(3)
        per_running = e[0].checkbox(
            "Queue: per running request",
            bool(data.get("per_running", False)),
            help="queue_depth: waiting requests per running one, the same on any engine size",
        )
        baseline_h = e[1].number_input(
            "Tail: baseline (h, 0 for none)",
            min_value=0.0,
            value=float(data.get("baseline_s") or 0) / 3600,
            help="tail_ratio: also fire only above a factor of its own ratio over this long",
        )
        factor = e[2].number_input(
            "Tail: factor over the baseline",
            min_value=1.0,
            value=float(data.get("baseline_factor", 1.5)),
        )
        enabled = st.checkbox("Enabled", data.get("enabled", True))
        if st.form_submit_button("Save rule"):
            try:
                rule = changes.save_rule(
                    store,
                    common.actor(),
                    {
                        **data,  # what the form does not show (a KV-slope rule's stable_rate)
                        "name": name,
                        "kind": kind,
                        "severity": severity,
                        "threshold": threshold,
                        "for_s": for_s,
                        "window_s": window_s,
                        "metric": metric,
                        "target": target,
                        "labels": parse_labels(labels),
                        "enabled": enabled,
                        "per_running": per_running,
                        "baseline_s": baseline_h * 3600 or None,
                        "baseline_factor": factor,
                    },
                    rule_id,
                )
            except KvscopeError as err:
                st.error(str(err))
            else:
                st.success(f"Saved: {rule.describe()}")
    if rule_id is not None and st.button("Remove this rule", key="rule_remove"):
        changes.remove_rule(store, common.actor(), rule_id)
        st.rerun()


def _history() -> None:
    st.subheader("History, last 30 days")
    rows = queries.alerts(common.store(), since=time.time() - 30 * 86400)
    if not rows:
        st.caption("No alert has fired in the last 30 days.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "fired": common.age(a.started_at),
                    "resolved": common.age(a.resolved_at) if a.resolved_at else "firing",
                    "lasted": f"{((a.resolved_at or time.time()) - a.started_at) / 60:.1f} min",
                    "severity": a.severity,
                    "rule": a.rule,
                    "target": a.target,
                    "message": a.message,
                }
                for a in rows
            ]
        ),
        hide_index=True,
        width="stretch",
    )


def _global_slo() -> SLO | None:
    """The SLO for every target, which the exported burn-rate rules watch."""
    for _, _, target_id, spec in queries.list_slos(common.store()):
        if target_id is None:
            return parse_slo(spec)
    return None


def _exports(parsed: ParsedRules) -> None:
    st.subheader("For Prometheus and Grafana")
    c1, c2 = st.columns(2)
    c1.download_button(
        "Prometheus alerting rules (YAML)",
        prometheus_rules_yaml(list(parsed.valid.values()), slo=_global_slo()),
        file_name="kvscope-rules.yml",
        mime="application/yaml",
    )
    c2.download_button(
        "Grafana dashboard (JSON)",
        grafana_dashboard_json(),
        file_name="kvscope-dashboard.json",
        mime="application/json",
    )
    st.caption(
        "The same rules as Prometheus alerts (they pass `promtool check rules`), and "
        "the Live and Tail panels over Prometheus. See docs/exports.md."
    )
