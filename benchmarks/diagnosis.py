"""The diagnosis' confusion table on the real CPU engine: every cause of
tests/support/injection.py injected `--rounds` times (in the order none, queueing,
kv_pressure, prefill_interference, down; round r draws its prompts with seed r), each
window judged on its own. Prints the table and the share right; the bar is 90% of
injected windows right and no quiet window named a cause.

    .venv/bin/python -m benchmarks.diagnosis --rounds 3
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from probes.engine.spec import build_tiny_model, embedded_spec
from probes.worker import Worker
from storage import queries as q
from storage.schemas import RunRow
from storage.settings import Settings
from tests.support import injection
from tests.support.waiting import free_port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals a scenario")
    ap.add_argument("--causes", nargs="*", default=list(injection.CAUSES), help="inject only these")
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-diag-") as folder:
        settings = Settings(
            data_dir=Path(folder), scrape_interval_s=1.0, engine_venv=root / ".engine-venv",
            embedded_port=free_port(), demo_load=False,
        )  # fmt: skip
        build_tiny_model(settings)
        worker = Worker(settings)
        worker.start()
        stop = threading.Event()

        def tick() -> None:
            while not stop.is_set():
                worker.tick()
                stop.wait(0.3)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()

        def request(
            kind: str, timeout: float = 600, target: str | None = None, **params: object
        ) -> RunRow:
            tid = q.get_target(worker.store, target).id if target else None
            run = q.request_run(worker.store, kind, dict(params), target_id=tid)
            deadline = time.time() + timeout
            while time.time() < deadline:
                run = q.get_run(worker.store, run.id)
                if run.status not in ("queued", "running"):
                    return run
                time.sleep(0.5)
            raise RuntimeError(f"{kind} did not finish in {timeout} s")

        try:
            spec = injection.diag_spec(embedded_spec(settings), free_port())
            q.save_engine_spec(worker.store, spec.name, spec.model_dump())
            started = request("engine_start", name=spec.name)
            if started.status != "done":
                raise SystemExit(f"engine did not start: {started.error}")
            pairs = []
            for r in range(args.rounds):
                for cause in args.causes:
                    window = injection.inject(request, worker, cause, args.duration, seed=r)
                    v, found = injection.judge(worker, window)
                    pairs.append((cause, v.cause.value))
                    print(
                        f"round {r + 1} {cause:>21} -> {v.cause.value:<21} score {v.score:.2f} "
                        f"runner-up {v.runner_up.value} ({v.runner_up_score:.2f}) "
                        f"window {window[1] - window[0]:.0f} s",
                        flush=True,
                    )
                    if v.cause.value != cause:
                        print("   ", injection.describe(v, found), flush=True)
            right = sum(i == n for i, n in pairs)
            quiet_wrong = sum(i == "none" and n != "none" for i, n in pairs)
            print()
            print(injection.confusion(pairs))
            share = right / len(pairs)
            print(f"\n{right}/{len(pairs)} injected windows named right ({share:.0%}); "
                  f"quiet windows named a cause: {quiet_wrong}")  # fmt: skip
        finally:
            stop.set()
            ticker.join(timeout=10)
            for manager in worker.engines.values():
                manager.stop(timeout=10)
            worker.stop()


if __name__ == "__main__":
    main()
