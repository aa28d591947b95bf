"""Early warnings: alert rule kinds, their defaults and validation (`rules`), and the
evaluator that judges each enabled rule on each target over stored series (`evaluate`).
May import `planner` and `storage`.
"""

from probes.alerting.evaluate import AlertEvaluator
from probes.alerting.rules import DEFAULT_RULES, AlertRule, RuleKind, parse_rule, rules_from_rows

__all__ = [
    "DEFAULT_RULES",
    "AlertEvaluator",
    "AlertRule",
    "RuleKind",
    "parse_rule",
    "rules_from_rows",
]
