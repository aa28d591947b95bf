"""The A/B probe on the real CPU engine: chunked prefill (512-token chunks) against whole
prefills, on short requests with one in nine a 7,000-token prompt (the diag engine of
tests/support/injection.py: 4 slots, 16,384 tokens of KV). Prints each round and each
arm's medians with the spread.

    .venv/bin/python -m benchmarks.ab --rounds 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

from probes.kinds.ab import Result
from tests.support import injection

A = {"enable_chunked_prefill": True, "max_num_batched_tokens": 512}
B = {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals an arm")
    args = ap.parse_args()
    venv = Path(__file__).resolve().parents[1] / ".engine-venv"
    with injection.diag_worker(venv) as (_, request):
        run = request(
            "ab", target=injection.NAME, timeout=3600, confirm=True, rounds=args.rounds,
            rate=2, duration_s=args.duration, profile=injection.MIX, request_timeout_s=120,
            a=A, b=B,
        )  # fmt: skip
    if run.status != "done":
        raise SystemExit(f"the A/B run ended {run.status}: {run.error}")
    result = Result.model_validate(run.summary)
    print("round arm  short TTFT p99 ms  ITL p99 ms  worst ITL ms  requests")
    for x in result.runs:
        print(f"{x.round:>5} {x.arm:>3}  {_ms(x.short_ttft_p99_s):>16}  {_ms(x.itl_p99_s):>10}  "
              f"{_ms(x.itl_max_s):>12}  {x.requests:>8}")  # fmt: skip
    print()
    print("| arm | short TTFT p99 ms (median, range) | ITL p99 ms | worst ITL ms |")
    print("|---|---|---|---|")
    for arm in result.arms:
        settings = ", ".join(f"{k}={v}" for k, v in arm.settings.items())

        def cell(v: float | None, r: tuple[float, float] | None) -> str:
            return _ms(v) + ("" if r is None else f" ({_ms(r[0])}-{_ms(r[1])})")

        print(f"| {arm.arm}: {settings} | {cell(arm.short_ttft_p99_s, arm.short_ttft_p99_range)} "
              f"| {cell(arm.itl_p99_s, arm.itl_p99_range)} "
              f"| {cell(arm.itl_max_s, arm.itl_max_range)} |")  # fmt: skip


if __name__ == "__main__":
    main()
