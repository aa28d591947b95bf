"""The planner against every published vLLM startup log in tests/fixtures/vllm_startup_logs:
logged KV tokens, planned tokens (or the range when the planner is unsure), error per row,
median and worst. Markdown, for docs/planner.md.
Run: .venv/bin/python benchmarks/ground_truth.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.ground_truth import median_abs_error, rows


def main() -> None:
    all_rows = rows()
    print("| log | vLLM | GPU | TP/PP | accounting | logged tokens | planned | error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in all_rows:
        low, high = r.plan.kv_capacity_range
        planned = f"{low:,}" if low == high else f"{low:,} - {high:,} (unsure)"
        acc = r.plan.accounting.accounting.key if r.plan.accounting else "-"
        print(
            f"| {r.name} | {r.report.version} | {r.entry['gpu']} | {r.plan.tp}/{r.plan.pp} | "
            f"{acc} | {r.logged:,} | {planned} | {r.error:+.2%} |"
        )
    sure = [r for r in all_rows if not r.unsure]
    print()
    print(
        f"{len(all_rows)} logs, {len(sure)} with one number: median |error| "
        f"{median_abs_error(sure):.2%}, worst over {max(r.error for r in sure):+.2%}, "
        f"worst under {min(r.error for r in sure):+.2%}; "
        f"{sum(r.in_range for r in all_rows if r.unsure)}/{len(all_rows) - len(sure)} unsure "
        "rows inside their range"
    )


if __name__ == "__main__":
    main()
