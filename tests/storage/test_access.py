"""Roles, the audit log (append-only in the database) and masking of secrets."""

from __future__ import annotations

import io
import json

import pytest
from sqlalchemy import Engine, text

from planner.errors import Forbidden, InvalidInput, StorageError
from storage.access import MASK, Action, Actor, Origin, Role, entries, export_jsonl, guarded, mask
from storage.access.roles import NEEDS

VIEWER = Actor("vera", Role.VIEWER, Origin.CONSOLE)
OPERATOR = Actor("omar", Role.OPERATOR, Origin.CONSOLE)
ADMIN = Actor("ada", Role.ADMIN, Origin.CONSOLE)


def test_every_action_names_the_role_it_needs_and_roles_nest() -> None:
    assert set(NEEDS) == set(Action)
    assert Role.ADMIN.allows(Role.OPERATOR) and Role.OPERATOR.allows(Role.VIEWER)
    assert not Role.VIEWER.allows(Role.OPERATOR) and not Role.OPERATOR.allows(Role.ADMIN)
    assert Actor.machine_owner().role is Role.ADMIN and Actor.machine_owner().owns_machine
    assert not ADMIN.owns_machine


def test_guarded_records_refused_failed_and_ok(store: Engine) -> None:
    refused = r"target.add needs the admin role \(omar has operator\)"
    params = {"base_url": "http://x"}
    with (
        pytest.raises(Forbidden, match=refused),
        guarded(store, OPERATOR, Action.TARGET_ADD, "prod", params),
    ):
        raise AssertionError("must not run")
    with pytest.raises(InvalidInput), guarded(store, ADMIN, Action.TARGET_ADD, "prod"):
        raise InvalidInput("bad URL")
    with guarded(store, ADMIN, Action.TARGET_ADD, "prod", {"token_env": "KVSCOPE_TOKEN_A"}):
        pass
    got = [(e.actor, e.role, e.origin, e.outcome, e.message) for e in reversed(entries(store))]
    assert got == [
        ("omar", "operator", "console", "refused", got[0][4]),
        ("ada", "admin", "console", "failed", "bad URL"),
        ("ada", "admin", "console", "ok", None),
    ]
    # A variable's name is not a secret; it stays readable.
    assert entries(store)[0].params == {"token_env": "KVSCOPE_TOKEN_A"}


def test_the_audit_log_is_append_only_in_the_database(store: Engine) -> None:
    with guarded(store, ADMIN, Action.SLO_SAVE, "chat"):
        pass
    for statement in ("UPDATE audit_log SET actor = 'mallory'", "DELETE FROM audit_log"):
        with pytest.raises(StorageError, match="append-only"), store.begin() as conn:
            conn.execute(text(statement))
    assert [e.actor for e in entries(store)] == ["ada"]


def test_export_is_one_json_object_a_line_oldest_first(store: Engine) -> None:
    for subject in ("a", "b"):
        with guarded(store, ADMIN, Action.SLO_SAVE, subject):
            pass
    out = io.StringIO()
    assert export_jsonl(store, out) == 2
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["subject"] for line in lines] == ["a", "b"]
    assert {"actor", "role", "origin", "action", "params", "outcome", "ts"} <= set(lines[0])


def test_secrets_are_masked_wherever_they_sit() -> None:
    spec = {
        "env": {"HF_TOKEN": "hf_abcdef", "OMP_NUM_THREADS": "4"},
        "args": ["--api-key", "sk-123456", "--api-key=sk-123456", "--port", "8000"],
        "token_env": "KVSCOPE_TOKEN_PROD",
        "note": "sent Authorization: Bearer sk-123456 to it",
        "password": "",
    }
    got = mask(spec)
    assert got["env"] == {"HF_TOKEN": MASK, "OMP_NUM_THREADS": "4"}
    assert got["args"] == ["--api-key", MASK, f"--api-key={MASK}", "--port", "8000"]
    assert got["token_env"] == "KVSCOPE_TOKEN_PROD"
    assert "sk-123456" not in json.dumps(got)
    assert mask("the key hf_abcdef leaked", known=("hf_abcdef",)) == f"the key {MASK} leaked"


def test_token_counts_and_tokenizers_are_not_secrets() -> None:
    """`--max-num-batched-tokens 8192` and a KV capacity in tokens were shown as ••••."""
    args = ["--max-num-batched-tokens", "8192", "--tokenizer", "/models/t", "--hf-token", "hf_x"]
    assert mask(args) == ["--max-num-batched-tokens", "8192", "--tokenizer", "/models/t",
                          "--hf-token", MASK]  # fmt: skip
    facts = {"kv_capacity": {"tokens": "16,384"}, "max_num_batched_tokens": 8192, "api_token": "x"}
    assert mask(facts) == {"kv_capacity": {"tokens": "16,384"}, "max_num_batched_tokens": 8192,
                           "api_token": MASK}  # fmt: skip
