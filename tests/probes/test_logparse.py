"""vLLM log lines become facts: a real CPU startup log, and V0 / GPU / OOM lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.vllm.logparse import LogParser, parse_line

STARTUP = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "vllm_cpu_0.32.0_startup.log"


def test_real_cpu_startup_log() -> None:
    parser = LogParser()
    facts = [f for line in STARTUP.read_text().splitlines() for f in parser.feed(line)]
    by_kind = {f.kind: f.values for f in facts}
    assert by_kind["kv_capacity"] == {"device": "CPU", "tokens": 262144.0}
    assert by_kind["max_concurrency"] == {"tokens_per_request": 8192.0, "concurrency": 32.0}
    assert by_kind["kv_memory"] == {"gib": 0.25}
    assert not [f for f in facts if f.severity == "error"]
    assert len(parser.tail) <= 200


@pytest.mark.parametrize(
    ("line", "kind", "values"),
    [
        (
            "(EngineCore_DP0 pid=1) INFO 05-01 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: "
            "331,584 tokens",
            "kv_capacity",
            {"device": "GPU", "tokens": 331584.0},
        ),
        (
            "INFO 05-01 10:00:00 [kv_cache_utils.py:1] Maximum concurrency for 65,536 tokens per "
            "request: 18.23x",
            "max_concurrency",
            {"tokens_per_request": 65536.0, "concurrency": 18.23},
        ),
        (
            "INFO [gpu_worker.py:1] Available KV cache memory: 20.27 GiB",
            "kv_memory",
            {"gib": 20.27},
        ),
        (
            "INFO [gpu_model_runner.py:1] Model loading took 2.89 GiB memory and 5.1 seconds",
            "model_memory",
            {"gib": 2.89},
        ),
        (
            "INFO 04-01 10:00:00 executor_base.py:1] # GPU blocks: 5102, # CPU blocks: 4681",
            "v0_blocks",
            {"gpu_blocks": 5102.0, "cpu_blocks": 4681.0},
        ),
        (
            "INFO worker.py:1] model weights take 15.51GiB; non_torch_memory takes 0.28GiB; "
            "PyTorch activation peak memory takes 1.16GiB; the rest of the memory reserved for "
            "KV Cache is 4.36GiB.",
            "v0_memory",
            {"weights_gib": 15.51, "kv_gib": 4.36},
        ),
        (
            "ValueError: To serve at least one request with the model's max seq len (131072), "
            "(16.0 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(9.5 GiB). Based on the available memory, the estimated maximum model length is "
            "77824. Try increasing `gpu_memory_utilization`",
            "oom",
            {"max_seq_len": 131072.0, "estimated_max_model_len": 77824.0},
        ),
        (
            "WARNING scheduler.py:1] Sequence group 7 is preempted by PreemptionMode.RECOMPUTE "
            "mode because there is not enough KV cache space. ... "
            "total_num_cumulative_preemption=51",
            "preemption",
            {"mode": "RECOMPUTE", "total": 51.0},
        ),
    ],
)
def test_known_lines(line: str, kind: str, values: dict[str, object]) -> None:
    facts = parse_line(line)
    assert [(f.kind, f.values) for f in facts] == [(kind, values)]


def test_v1_prints_capacity_and_concurrency_on_one_line() -> None:
    facts = parse_line(
        "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 8,192 "
        "tokens per request: 128.00x"
    )
    assert [f.kind for f in facts] == ["kv_capacity", "max_concurrency"]


def test_out_of_memory_lines_are_errors() -> None:
    for line in (
        "No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ):
        facts = parse_line(line)
        assert len(facts) == 1 and facts[0].kind == "oom" and facts[0].severity == "error"


def test_a_traceback_is_one_fact_with_its_lines() -> None:
    parser = LogParser()
    lines = [
        "(EngineCore pid=5) ERROR 11-29 10:00:00 [core.py:1] EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "/x/core.py", line 10, in run',
        "    self.step()",
        "RuntimeError: boom at step 3",
        "next line",
    ]
    facts = [f for line in lines for f in parser.feed(line)]
    tb = [f for f in facts if f.kind == "traceback"]
    assert len(tb) == 1 and tb[0].values["exception"] == "RuntimeError: boom at step 3"
    assert tb[0].values["lines"][0].startswith("Traceback")
    assert tb[0].message == "engine traceback: RuntimeError: boom at step 3"


def test_plain_lines_are_no_facts() -> None:
    assert parse_line('INFO:     127.0.0.1:5555 - "GET /metrics HTTP/1.1" 200 OK') == []
