"""The judgement itself, on hand-made signals: the bar, the degraded bar, ties, runner-up."""

from __future__ import annotations

from dataclasses import replace

from planner.diagnosis import BAR, Baseline, Cause, Signals, judge, scores

CALM = Signals(0, 60, up_share=1.0, finished=30, ttft_p50_s=0.02, ttft_p99_s=0.06,
               itl_p50_s=0.005, itl_p99_s=0.02, tpot_p50_s=0.005, ttft_mean_s=0.025,
               queue_mean_s=0.0001, waiting_mean=0, running_mean=1, kv_max=0.05,
               prompt_p50=70, prompt_p99=99, prompt_mean=72, kv_capacity_tokens=16384)  # fmt: skip


def _with(**changes: object) -> Signals:
    return Signals(**{**{f: getattr(CALM, f) for f in CALM.__dataclass_fields__}, **changes})


def test_a_calm_window_is_none_with_no_runner_up() -> None:
    v = judge(CALM)
    assert (v.cause, v.runner_up, v.evidence, v.degraded) == (Cause.NONE, Cause.NONE, (), None)


def test_a_weak_cause_is_named_only_when_the_tail_is_known_to_be_worse() -> None:
    # A short queue: a third of TTFT is queue time.
    weak = _with(queue_mean_s=0.01, ttft_mean_s=0.03, waiting_mean=0.6)
    (top, *_) = scores(weak)
    assert top.cause is Cause.QUEUEING and 0.2 <= top.score < BAR
    assert judge(weak).cause is Cause.NONE
    broken = _with(queue_mean_s=0.01, ttft_mean_s=0.03, waiting_mean=0.6, slo_violated=True)
    assert (judge(broken).cause, judge(broken).degraded) == (Cause.QUEUEING, True)
    base = Baseline(ttft_p99_s=0.01, itl_p99_s=0.02)
    assert judge(weak, base).cause is Cause.QUEUEING  # p99 six times its baseline


def test_a_tie_goes_to_the_cause_that_explains_the_other() -> None:
    both = _with(up_share=0.5, failed=30)  # half the window unanswered, every request failed
    v = judge(both)
    assert (v.cause, v.runner_up, v.score, v.runner_up_score) == (
        Cause.DOWN, Cause.ERRORS, 1.0, 1.0
    )  # fmt: skip


def test_no_room_for_the_next_prompt_is_kv_pressure_without_a_full_cache() -> None:
    # vLLM admits a request only when its prompt's blocks are free: at 79% of 16,384 tokens
    # a 6,000-token prompt waits, although usage never reached 90%.
    waiting = _with(kv_max=0.79, prompt_mean=6000, waiting_mean=4, queue_mean_s=9.8,
                    ttft_mean_s=10.5)  # fmt: skip
    v = judge(waiting)
    assert (v.cause, v.runner_up) == (Cause.KV_PRESSURE, Cause.QUEUEING)
    roomy = _with(kv_max=0.79, prompt_mean=70, waiting_mean=4, queue_mean_s=9.8, ttft_mean_s=10.5)
    assert judge(roomy).cause is Cause.QUEUEING


def test_unanswered_scrapes_of_an_engine_serving_its_queue_are_not_down() -> None:
    """A saturated engine beside a CPU hog left a fifth of its scrapes unanswered while it
    served every request (the end-to-end queueing scenario once read "down"): the queue is
    the cause, the scrapes the runner-up. Gone, or failing its requests, it is down."""
    busy = _with(up_share=0.8, finished=144, waiting_mean=30, queue_mean_s=3.5, ttft_mean_s=3.56)
    v = judge(busy)
    assert (v.cause, v.runner_up) == (Cause.QUEUEING, Cause.DOWN)
    assert v.runner_up_score == 0.5
    assert judge(_with(up_share=0.8, finished=0, waiting_mean=30)).cause is Cause.DOWN
    failing = _with(up_share=0.8, finished=144, failed=20, waiting_mean=30, queue_mean_s=3.5,
                    ttft_mean_s=3.56)  # fmt: skip
    assert judge(failing).cause is Cause.DOWN
    assert judge(_with(up_share=0.8, finished=144)).cause is Cause.DOWN  # no queue: gone a while


def test_queue_time_without_a_standing_queue_leaves_the_stall_to_the_long_prefills() -> None:
    """Beside a CPU hog, the short requests of the end-to-end prefill scenario spent half
    their TTFT in the scheduler's queue, behind whole 5,000-token prefills, while no scrape
    saw a request waiting: queueing cannot claim that window, so its queue share must not
    take the stall from prefill interference (it once named none). With a standing queue,
    the queue still claims it."""
    held = _with(finished=11, prompt_p50=64, prompt_p99=5000, prompt_mean=600,
                 itl_p50_s=0.01, itl_p99_s=0.049, ttft_p50_s=0.4, ttft_p99_s=4.0,
                 ttft_mean_s=3.6, queue_mean_s=1.9, waiting_mean=0.0)  # fmt: skip
    v = judge(held)
    assert v.cause is Cause.PREFILL_INTERFERENCE and v.score >= BAR
    queued = replace(held, waiting_mean=3.0)
    assert judge(queued).cause is Cause.QUEUEING
