"""A real Prometheus server for the tests: Debian's `prometheus`, on a free loopback port,
scraping the given loopback targets every second, its data in a temporary folder, stopped
by PID."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.cli import stop

BINARY = "prometheus"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def prometheus(targets: dict[str, str], interval_s: float = 1.0) -> Iterator[str]:
    """Scrape each `job -> host:port` every `interval_s`; yields the server's base URL once
    it answers queries."""
    binary = shutil.which(BINARY)
    if binary is None:
        raise RuntimeError(
            "these tests need Prometheus' server (Debian: apt install prometheus; .ci/run "
            "installs it)"
        )
    folder = Path(tempfile.mkdtemp(prefix="kvscope-prom-"))
    config = {
        "global": {"scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [address]}]}
            for job, address in targets.items()
        ],
    }
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = _free_port()
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--web.enable-lifecycle"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Prometheus did not start: {(folder / 'server.log').read_text()[-2000:]}"
                )
            time.sleep(0.2)
        yield url
    finally:
        stop(proc)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def wait_scraped(url: str, job: str, timeout: float = 60.0) -> float:
    """Wait until Prometheus holds a sample of `up{job=...}` (its first scrape comes a few
    seconds after it is ready); the time it appeared."""
    query = urllib.parse.urlencode({"query": f'up{{job="{job}"}}'})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=2) as resp,
        ):
            if json.loads(resp.read())["data"]["result"]:
                return time.time()
        time.sleep(0.2)
    raise AssertionError(f"Prometheus at {url} did not scrape job {job} in {timeout:g} s")
