"""Conversation access as rows of the log (issue 20 item 3, projection layout 7): no Kafka, no Postgres.

A scripted partition: ``c1`` is opened by its first admission (``tester``), bob is granted ``read`` then ``act``
(the later grant replaces the earlier), carol ``read``; bob's access is revoked, and the revoking command's input read
again after a grant of carol's ``act`` is only a duplicate: it changes nothing. The rows do not depend on how the
log is cut into chunks, and the fold holds the same access.
"""

from __future__ import annotations

import random
from typing import Any

from settled.projections import TABLES, ProjectionState, RowSet, TableMode, merge_rows, project_batch
from settled.protocol import fold
from settled.schemas import AccessGranted, AccessLevel, AccessRevoked, Genesis, InputRef, LogBatch
from tests.integration.projection_script import T0, Script, admitted

C1 = "conv-access"


def _ref(offset: int) -> InputRef:
    return InputRef(topic="t.inbox", partition=0, offset=offset)


def access_log() -> list[LogBatch]:
    s = Script()
    s.add("~partition/0", Genesis(namespace="scripted", partition_count=1, created_at=T0))
    s.claim(1, "worker-a")
    s.add(C1, admitted("s1", C1, 1, {"q": "hi"}))
    s.add(C1, AccessGranted(command_id="g1", grantee="bob", access=AccessLevel.READ, principal="tester",
                            input_ref=_ref(1)))  # fmt: skip
    s.add(C1, AccessGranted(command_id="g2", grantee="bob", access=AccessLevel.ACT, principal="tester",
                            input_ref=_ref(2)),
          AccessGranted(command_id="g3", grantee="carol", access=AccessLevel.READ, principal="ops",
                        input_ref=_ref(3)))  # fmt: skip
    s.add(C1, AccessRevoked(command_id="r1", grantee="bob", principal="tester", input_ref=_ref(4)))
    s.add(C1, admitted("s2", C1, 2, {"q": "again"}))  # a second submission opens nothing
    s.add(C1, AccessGranted(command_id="g4", grantee="carol", access=AccessLevel.ACT, principal="tester",
                            input_ref=_ref(5)))  # fmt: skip
    # The grant g1 sent again (its input read again after the revocation): a duplicate, it grants nothing.
    s.add(C1, AccessGranted(command_id="g1", grantee="bob", access=AccessLevel.READ, principal="tester",
                            input_ref=_ref(6)))  # fmt: skip
    return s.batches


def _project(batches: list[LogBatch]) -> RowSet:
    rows = RowSet()
    state = ProjectionState.empty(0)
    for offset, batch in enumerate(batches):
        state = project_batch(state, batch, offset, rows)
    return rows


def _access(rows: RowSet) -> dict[str, tuple[Any, ...]]:
    spec = TABLES["conversation_access"]
    out = {}
    for row in rows.tables["conversation_access"].values():
        r = dict(zip(spec.columns, row, strict=True))
        assert r["conversation_id"] == C1
        out[r["principal"]] = (r["access"], r["granted_by"], r["command_id"])
    return out


def test_the_opener_grants_and_revocations_are_rows_and_a_repeated_grant_changes_nothing() -> None:
    batches = access_log()
    assert _access(_project(batches)) == {
        "tester": ("opener", None, None),
        "bob": ("revoked", "tester", "r1"),
        "carol": ("act", "tester", "g4"),
    }
    conv = fold(ProjectionState.empty(0).head, batches).conversation(C1)
    assert conv.access == {"carol": AccessLevel.ACT}
    receipts = _project(batches).tables["receipts"]
    assert {key[1]: row[3] for key, row in receipts.items() if key[1] in {"g1", "g4", "r1"}} == {
        "g1": "applied",
        "g4": "applied",
        "r1": "applied",
    }, receipts


def test_access_rows_do_not_depend_on_how_the_log_is_cut_into_chunks() -> None:
    batches = access_log()
    whole = _project(batches)
    for seed in range(20):
        rng = random.Random(seed)
        db: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]] = {name: {} for name in TABLES}
        state = ProjectionState.empty(0)
        offset = 0
        while offset < len(batches):
            size = rng.randint(1, 4)
            chunk = RowSet()
            working = state.working()
            for i in range(offset, min(offset + size, len(batches))):
                working = project_batch(working, batches[i], i, chunk)
            state = working.commit()
            offset += size
            for name, spec in TABLES.items():
                for key, row in chunk.tables[name].items():
                    old = db[name].get(key)
                    if old is None:
                        db[name][key] = row
                    elif spec.mode is TableMode.UPSERT:
                        db[name][key] = merge_rows(spec, old, row)
                    else:
                        assert spec.mode is TableMode.FIRST, f"{name} {key} written twice"
        assert db["conversation_access"] == whole.tables["conversation_access"], f"seed {seed}"
