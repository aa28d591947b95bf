"""A throwaway PostgreSQL cluster for the tests: Debian's server binaries, `initdb` into a
temporary folder, a free loopback port, stopped by PID when the session ends.

Each test gets a database of its own, copied from a template the migrations ran on once
(`CREATE DATABASE ... TEMPLATE`: milliseconds, where migrating afresh takes a second).
As root the server runs as the `postgres` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine, text

from storage.db import open_store
from tests.support.cli import stop

BIN_GLOB = "/usr/lib/postgresql/*/bin"
TEMPLATE = "kvscope_template"


class NoPostgres(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def server_bindir() -> Path:
    """The newest installed PostgreSQL's binaries (`KVSCOPE_TEST_PG_BIN` overrides)."""
    given = os.environ.get("KVSCOPE_TEST_PG_BIN")
    if given:
        return Path(given)
    found = sorted(glob.glob(BIN_GLOB), key=lambda p: int(Path(p).parent.name.split(".")[0]))
    found = [p for p in found if Path(p, "initdb").is_file()]
    if not found:
        raise NoPostgres(
            "the PostgreSQL tests need PostgreSQL's server binaries (Debian: apt install "
            "postgresql-15; .ci/run installs them), or KVSCOPE_TEST_BACKENDS=sqlite to run "
            "the store-backed tests on SQLite only"
        )
    return Path(found[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A running server; `database()` hands out a fresh migrated database."""

    folder: Path
    port: int
    proc: subprocess.Popen[bytes]
    _names: itertools.count[int] = field(default_factory=itertools.count)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://kvscope@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        engine = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(text(sql))
        finally:
            engine.dispose()

    def database(self, migrated: bool = True) -> str:
        """The URL of a new database: a copy of the migrated template, or empty."""
        name = f"t{next(self._names)}_{os.getpid()}"
        self._admin(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE if migrated else 'template0'}")
        return self.url(name)

    def drop(self, url: str) -> None:
        """Drop a database handed out (closing what still holds it)."""
        name = url.rsplit("/", 1)[-1]
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """Fast shutdown by PID (SIGINT: roll back and exit), then the folder goes."""
        stop(self.proc, signal.SIGINT)
        shutil.rmtree(self.folder, ignore_errors=True)


def start_cluster() -> Cluster:
    """initdb, start on a free loopback port, create the migrated template."""
    bindir = server_bindir()
    folder = Path(tempfile.mkdtemp(prefix="kvscope-pg-"))
    data, sockets, log = folder / "data", folder / "sock", folder / "server.log"
    sockets.mkdir()
    user: str | None = None
    if os.getuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        for path in (folder, sockets):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    subprocess.run(
        [bindir / "initdb", "-D", data, "-U", "kvscope", "--auth=trust", "-E", "UTF8",
         "--no-locale", "--no-sync"],
        check=True, capture_output=True, user=user, cwd=folder,
    )  # fmt: skip
    port = _free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [bindir / "postgres", "-D", data, "-p", str(port), "-k", sockets,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=300"],
            stdout=out, stderr=subprocess.STDOUT, user=user, cwd=folder,
        )  # fmt: skip
    cluster = Cluster(folder, port, proc)
    deadline = time.monotonic() + 60
    while True:
        try:
            cluster._admin(f"CREATE DATABASE {TEMPLATE}")
            break
        except Exception as err:
            if proc.poll() is not None or time.monotonic() > deadline:
                cluster.stop()
                raise RuntimeError(f"PostgreSQL did not start: {log.read_text()[-2000:]}") from err
            time.sleep(0.2)
    open_store(cluster.url(TEMPLATE)).dispose()
    return cluster
