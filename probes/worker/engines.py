"""The worker's managed engines: one `EngineManager` per stored spec, made on first use;
adoption or cleanup of what a previous worker left running, the periodic supervision pass,
and stopping (or abandoning) them all.

Supervision (crash restarts, adoption) runs the spec as last started by someone allowed to,
never the one merely saved: a saved change takes effect at the next start or restart. An
engine never started on request is never started by supervision.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
from sqlalchemy import Engine

from planner.errors import InvalidInput
from probes.engine.manager import EngineManager
from probes.engine.spec import EngineSpec, parse_spec
from storage import queries as q

log = logging.getLogger("kvscope.worker")


class EngineRegistry(Mapping[str, EngineManager]):
    """The managers made so far, by engine name (a read-only mapping)."""

    def __init__(
        self, store: Engine, data_dir: Path, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.store = store
        self.data_dir = data_dir
        self.transport = transport
        self._managers: dict[str, EngineManager] = {}
        self._refusals: dict[str, str] = {}  # engines whose spec is refused, and why (said once)
        # Jobs, run handlers and the main loop ask at once; one manager per engine, always.
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> EngineManager:
        return self._managers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._managers))

    def __len__(self) -> int:
        return len(self._managers)

    def manager(self, name: str, spec: EngineSpec | None = None) -> EngineManager:
        """The manager of a stored engine, created on first use. It runs `spec` when given (a
        start on request), else the spec as last started (the saved one for an engine never
        started); a manager whose engine is down takes the new spec."""
        if spec is None:
            saved, _ = q.get_engine_spec(self.store, name)
            try:
                spec = parse_spec(q.get_started_spec(self.store, name) or saved)
            except InvalidInput:
                if name not in self._managers:
                    raise
                # A stored spec this kvscope refuses (written by an earlier one): the
                # manager keeps what it runs, so the engine can still be stopped.
                return self._managers[name]
        with self._lock:
            manager = self._managers.get(name)
            if manager is None:
                manager = EngineManager(self.store, self.data_dir, spec, self.transport)
                self._managers[name] = manager
                return manager
        manager.take_spec(spec)
        return manager

    def _wanted(self) -> list[tuple[str, str]]:
        """(name, desired state) of every stored engine; one never started is not wanted."""
        started = q.list_started_specs(self.store)
        return [
            (name, desired if started.get(name) is not None else "stopped")
            for name, _, desired in q.list_engine_specs(self.store)
        ]

    def adopt_or_clean(self) -> None:
        """At start: adopt each engine a previous worker left running as last started, or
        stop it."""
        for name, desired in self._wanted():
            try:
                self.manager(name).adopt_or_clean(desired)
            except Exception:
                log.exception("could not adopt or clean up engine %s", name)

    def supervise(self) -> None:
        """One supervision pass over every stored engine; one whose spec is refused is said
        once (an event), and the others are still supervised."""
        for name, desired in self._wanted():
            try:
                manager = self.manager(name)
            except InvalidInput as err:
                self._refused(name, str(err))
                continue
            self._refusals.pop(name, None)
            manager.poll(desired)

    def _refused(self, name: str, why: str) -> None:
        if self._refusals.get(name) == why:
            return
        self._refusals[name] = why
        q.record_event(
            self.store,
            "engine_spec_refused",
            f"engine {name} is not supervised: its stored spec is refused: {why}",
            severity="error",
        )

    def stop_all(self, keep: bool = False) -> None:
        """Stop every engine, or with `keep` leave them running unwatched (a crashed worker)."""
        for manager in list(self._managers.values()):
            if keep:
                manager.abandon()
                continue
            try:
                manager.stop(reason="stopped with the worker")
            except Exception:
                log.exception("could not stop engine %s", manager.spec.name)
