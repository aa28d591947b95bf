"""Who may do what: three roles, the actor behind each change, and the table of actions.

A role allows what the roles below it allow. An actor is a person (or the worker) with a
role and an origin: the console (a browser) or the CLI on the machine itself, whose user
owns the machine and acts as admin. Some things may be done only by the machine's owner,
never from a browser (the engine's executable, its model source, unsafe settings).
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from enum import StrEnum

from planner.errors import Forbidden


class Role(StrEnum):
    """viewer reads every page; operator also runs probes, starts, stops and restarts
    engines and acknowledges alerts; admin also configures (targets, engines, SLOs, rules,
    hosts, users)."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return list(Role).index(self)

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


class Origin(StrEnum):
    """Where an action comes from: a browser, a shell on the machine, or the worker."""

    CONSOLE = "console"
    CLI = "cli"
    WORKER = "worker"


@dataclass(frozen=True)
class Actor:
    """A person (or the worker) acting: name, role, origin."""

    name: str
    role: Role
    origin: Origin

    @classmethod
    def machine_owner(cls) -> Actor:
        """The CLI's user: a shell on the machine acts as admin."""
        try:
            name = getpass.getuser()
        except (KeyError, OSError):
            name = "unknown"
        return cls(name, Role.ADMIN, Origin.CLI)

    @classmethod
    def worker(cls) -> Actor:
        return cls("worker", Role.ADMIN, Origin.WORKER)

    @property
    def owns_machine(self) -> bool:
        """The CLI (or the worker): may set what a browser never may."""
        return self.origin is not Origin.CONSOLE

    def __str__(self) -> str:
        return f"{self.name} ({self.role}, {self.origin})"


class Action(StrEnum):
    """Every state-changing action, by the name the audit log records."""

    TARGET_ADD = "target.add"
    TARGET_UPDATE = "target.update"
    TARGET_REMOVE = "target.remove"
    TARGET_CHECK = "target.check"
    HOST_ALLOW = "host.allow"
    HOST_REMOVE = "host.remove"
    ENGINE_CONFIGURE = "engine.configure"
    ENGINE_START = "engine.start"
    ENGINE_STOP = "engine.stop"
    ENGINE_RESTART = "engine.restart"
    PROBE_RUN = "probe.run"
    PROBE_CANCEL = "probe.cancel"
    SCHEDULE_ADD = "schedule.add"
    SCHEDULE_REMOVE = "schedule.remove"
    PROFILE_SAVE = "profile.save"
    SLO_SAVE = "slo.save"
    SLO_REMOVE = "slo.remove"
    RULE_SAVE = "rule.save"
    RULE_REMOVE = "rule.remove"
    RULES_RESTORE = "rules.restore"
    ALERT_ACKNOWLEDGE = "alert.acknowledge"
    COST_SAVE = "cost.save"
    USER_ADD = "user.add"
    USER_REMOVE = "user.remove"
    USER_PASSWORD = "user.password"
    SIGN_IN = "sign.in"
    AUDIT_READ = "audit.read"


NEEDS: dict[Action, Role] = {
    Action.TARGET_ADD: Role.ADMIN,
    Action.TARGET_UPDATE: Role.ADMIN,
    Action.TARGET_REMOVE: Role.ADMIN,
    Action.TARGET_CHECK: Role.OPERATOR,
    Action.HOST_ALLOW: Role.ADMIN,
    Action.HOST_REMOVE: Role.ADMIN,
    Action.ENGINE_CONFIGURE: Role.ADMIN,
    Action.ENGINE_START: Role.OPERATOR,
    Action.ENGINE_STOP: Role.OPERATOR,
    Action.ENGINE_RESTART: Role.OPERATOR,
    Action.PROBE_RUN: Role.OPERATOR,
    Action.PROBE_CANCEL: Role.OPERATOR,
    Action.SCHEDULE_ADD: Role.ADMIN,
    Action.SCHEDULE_REMOVE: Role.ADMIN,
    Action.PROFILE_SAVE: Role.OPERATOR,
    Action.SLO_SAVE: Role.ADMIN,
    Action.SLO_REMOVE: Role.ADMIN,
    Action.RULE_SAVE: Role.ADMIN,
    Action.RULE_REMOVE: Role.ADMIN,
    Action.RULES_RESTORE: Role.ADMIN,
    Action.ALERT_ACKNOWLEDGE: Role.OPERATOR,
    Action.COST_SAVE: Role.OPERATOR,
    Action.USER_ADD: Role.ADMIN,
    Action.USER_REMOVE: Role.ADMIN,
    Action.USER_PASSWORD: Role.ADMIN,
    Action.SIGN_IN: Role.VIEWER,
    Action.AUDIT_READ: Role.ADMIN,
}


def allowed(actor: Actor, action: Action) -> bool:
    """Whether the actor's role allows the action (what pages use to show a button)."""
    return actor.role.allows(NEEDS[action])


def require(actor: Actor, action: Action) -> None:
    """Forbidden, with the role the action needs, unless the actor's role allows it."""
    needed = NEEDS[action]
    if not actor.role.allows(needed):
        raise Forbidden(f"{action} needs the {needed} role ({actor.name} has {actor.role})")
