"""Access: roles, the actor behind each change, the append-only audit log, and the guarded
actions that are the console's and the CLI's only way to change state.

roles (`Role`, `Origin`, `Actor`, `Action`, what each action needs), audit (`guarded`,
masking of secrets, reading and exporting the log), changes (SLOs, cost frames), targets
(targets and allowed hosts: where requests may go). May import `planner` (errors) and the
rest of `storage`.
"""

from storage.access.audit import MASK, AuditRow, entries, export_jsonl, guarded, mask, record
from storage.access.roles import NEEDS, Action, Actor, Origin, Role, allowed, require

__all__ = [
    "MASK",
    "NEEDS",
    "Action",
    "Actor",
    "AuditRow",
    "Origin",
    "Role",
    "allowed",
    "entries",
    "export_jsonl",
    "guarded",
    "mask",
    "record",
    "require",
]
