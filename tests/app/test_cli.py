"""`kvscope` commands as a user runs them: real processes, loopback servers, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.app.test_exports import validate_rules_file
from tests.support.cli import kvscope
from tests.support.fake_vllm import FakeVllm, serve


def test_scrape_once_json_prints_canonical_values(tmp_path: Path) -> None:
    fake = FakeVllm(
        kv_usage=0.375, running=2, waiting=1, preemptions=3, prompt_tokens=40, generation_tokens=70
    )
    fake.ttft.observe(0.015, 99)
    fake.ttft.observe(3.0, 1)
    with serve(fake) as url:
        res = kvscope("scrape", url, "--once", "--json", env_dir=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {
        k: out[k]
        for k in (
            "kv_usage",
            "running",
            "waiting",
            "preemptions_total",
            "prompt_tokens_total",
            "generation_tokens_total",
            "num_gpu_blocks",
            "block_size",
        )
    } == {
        "kv_usage": 0.375,
        "running": 2,
        "waiting": 1,
        "preemptions_total": 3,
        "prompt_tokens_total": 40,
        "generation_tokens_total": 70,
        "num_gpu_blocks": 1000,
        "block_size": 32,
    }
    assert out["ttft"]["count"] == 100
    assert out["ttft"]["p50"] == pytest.approx(0.01 + 0.01 * 50 / 99)
    assert out["ttft"]["p99"] == pytest.approx(0.02)
    assert set(out["itl"]) == {"count", "p50", "p95", "p99"}


@pytest.mark.parametrize(
    ("url_or_body", "message"),
    [
        ("http://127.0.0.1:9", "cannot connect to http://127.0.0.1:9/metrics"),
        ("ftp://example.com", "must start with http:// or https://"),
        ("<html>", "HTML/XML page, not Prometheus metrics text"),
        ("http://169.254.169.254", "169.254.169.254 is a link-local or cloud metadata address"),
        ("http://10.9.8.7:8000", "10.9.8.7 is not an allowed host"),
    ],
)
def test_scrape_failures_exit_2_with_one_line(
    url_or_body: str, message: str, tmp_path: Path
) -> None:
    if url_or_body.startswith("<"):
        fake = FakeVllm(body_override="<html><body>login</body></html>")
        with serve(fake) as url:
            res = kvscope("scrape", url, "--once", "--json", env_dir=tmp_path)
    else:
        res = kvscope("scrape", url_or_body, "--once", "--json", env_dir=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("error: ")
    assert res.stdout == ""


def test_target_add_list_remove(tmp_path: Path) -> None:
    assert kvscope("hosts", "allow", "10.1.2.3", env_dir=tmp_path).returncode == 0
    added = kvscope("target", "add", "prod", "http://10.1.2.3:8000", "--label", "pool=chat",
                    "--label", "region=eu", env_dir=tmp_path)  # fmt: skip
    assert added.returncode == 0, added.stderr
    dup = kvscope("target", "add", "prod", "http://10.1.2.3:8000", env_dir=tmp_path)
    assert dup.returncode == 2 and "already exists" in dup.stderr
    listed = json.loads(kvscope("target", "list", "--json", env_dir=tmp_path).stdout)
    assert [t["name"] for t in listed] == ["prod"]
    assert listed[0]["labels"] == {"pool": "chat", "region": "eu"}
    assert "pool=chat,region=eu" in kvscope("target", "list", env_dir=tmp_path).stdout
    gone = kvscope("target", "remove", "nope", env_dir=tmp_path)
    assert gone.returncode == 2 and "known targets: prod" in gone.stderr
    assert kvscope("target", "remove", "prod", env_dir=tmp_path).returncode == 0


def test_a_target_may_not_leak_a_variable_or_reach_cloud_metadata(tmp_path: Path) -> None:
    leak = kvscope(
        "target", "add", "leak", "http://127.0.0.1:9", "--token-env", "HOME", env_dir=tmp_path
    )
    meta = kvscope("target", "add", "meta", "http://169.254.169.254", env_dir=tmp_path)
    for res, reason in (
        (leak, "token variable HOME must start with KVSCOPE_TOKEN_"),
        (meta, "169.254.169.254 is a link-local or cloud metadata address"),
    ):
        assert res.returncode == 2 and res.stdout == ""
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith("error: ") and reason in line
    assert json.loads(kvscope("target", "list", "--json", env_dir=tmp_path).stdout) == []


def test_engine_configure_show_and_refusals(tmp_path: Path) -> None:
    made = kvscope(
        "engine",
        "configure",
        "gpu",
        "--device",
        "cuda",
        "--vllm",
        "/usr/bin/vllm",
        "--model",
        "org/model",
        "--set",
        "max_model_len=4096",
        env_dir=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    assert "/usr/bin/vllm serve org/model" in made.stdout
    shown = json.loads(kvscope("engine", "show", "gpu", "--json", env_dir=tmp_path).stdout)
    assert shown["spec"]["max_model_len"] == 4096 and shown["desired"] == "stopped"
    bad = kvscope("engine", "configure", "gpu", "--set", "block_size=abc", env_dir=tmp_path)
    assert bad.returncode == 2 and "block_size" in bad.stderr
    # Nothing already stored is lost by a refused change.
    again = json.loads(kvscope("engine", "show", "gpu", "--json", env_dir=tmp_path).stdout)
    assert again["spec"] == shown["spec"]
    start = kvscope("engine", "start", "gpu", env_dir=tmp_path)
    assert start.returncode == 2 and "no kvscope worker is running" in start.stderr
    unknown = kvscope("engine", "status", "nope", env_dir=tmp_path)
    assert unknown.returncode == 2 and "known engines: gpu" in unknown.stderr
    logs = kvscope("engine", "logs", "gpu", env_dir=tmp_path)
    assert logs.returncode == 2 and "has it ever started" in logs.stderr


def test_engine_configure_edits_the_environment(tmp_path: Path) -> None:
    made = kvscope("engine", "configure", "--env", "OMP_NUM_THREADS=1", env_dir=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1" in made.stdout
    dropped = kvscope(
        "engine", "configure", "--env", "VLLM_ENABLE_V1_MULTIPROCESSING=", env_dir=tmp_path
    )
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in dropped.stdout
    shown = json.loads(kvscope("engine", "show", "--json", env_dir=tmp_path).stdout)
    assert shown["spec"]["env"] == {"OMP_NUM_THREADS": "1"}
    bad = kvscope("engine", "configure", "--env", "NOEQUALS", env_dir=tmp_path)
    assert bad.returncode == 2
    assert "environment item 'NOEQUALS' is not KEY=VALUE" in bad.stderr
    again = json.loads(kvscope("engine", "show", "--json", env_dir=tmp_path).stdout)
    assert again["spec"] == shown["spec"]


def test_profiles_are_saved_listed_and_refused(tmp_path: Path) -> None:
    shown = kvscope("profile", "show", "fixed", env_dir=tmp_path)
    assert json.loads(shown.stdout) == {"kind": "fixed", "prompt_tokens": 512, "output_tokens": 128}
    src = tmp_path / "mine.json"
    src.write_text('{"kind": "fixed", "prompt_tokens": 7, "output_tokens": 3}')
    assert kvscope("profile", "save", "mine", "--file", str(src), env_dir=tmp_path).returncode == 0
    assert (
        "mine                 stored  fixed" in kvscope("profile", "list", env_dir=tmp_path).stdout
    )
    src.write_text('{"kind": "fixed", "prompt_tokens": 0}')
    bad = kvscope("profile", "save", "mine", "--file", str(src), env_dir=tmp_path)
    assert bad.returncode == 2 and "prompt_tokens: Input should be greater than 0" in bad.stderr
    # The refused one did not replace what was stored.
    assert (
        json.loads(kvscope("profile", "show", "mine", env_dir=tmp_path).stdout)["prompt_tokens"]
        == 7
    )
    clash = kvscope("profile", "save", "chat", "--file", str(src), env_dir=tmp_path)
    assert clash.returncode == 2 and "not a preset" in clash.stderr


def test_exports_from_a_shell(tmp_path: Path) -> None:
    import shutil

    rules = tmp_path / "rules.yml"
    res = kvscope("export", "prometheus-rules", "--out", str(rules), env_dir=tmp_path)
    assert res.returncode == 0 and "groups:" in rules.read_text()
    assert validate_rules_file(rules, shutil.which("promtool")) == []
    dash = json.loads(kvscope("export", "grafana-dashboard", env_dir=tmp_path).stdout)
    assert dash["title"].startswith("kvscope") and dash["panels"]
    bad = kvscope(
        "export", "grafana-dashboard", "--out", str(tmp_path / "no" / "x.json"), env_dir=tmp_path
    )
    assert bad.returncode == 2 and "cannot write" in bad.stderr


def test_a_target_read_from_prometheus_from_a_shell(tmp_path: Path) -> None:
    sel = '{job="vllm",instance="127.0.0.1:8000"}'
    ok = kvscope("target", "add", "viaprom", "--prometheus", "http://127.0.0.1:9090",
                 "--selector", sel, env_dir=tmp_path)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "read from Prometheus as {job=" in ok.stdout
    (row,) = json.loads(kvscope("target", "list", "--json", env_dir=tmp_path).stdout)
    assert (row["source"], row["selector"], row["base_url"]) == (
        "prometheus",
        sel,
        "http://127.0.0.1:9090",
    )
    both = kvscope("target", "add", "x", "http://127.0.0.1:8000", "--prometheus",
                   "http://127.0.0.1:9090", env_dir=tmp_path)  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stderr
