"""Every authoritative produce goes through the transactional appender (issue 4 item 5; scenario 11).

A static check over settled's own source: ``.produce(`` calls and ``Producer(`` constructions may appear only in the
modules listed here, each with the reason it is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "settled"

ALLOWED = {
    "producers/_appender.py": "the transactional appender: log, receipts, settlements, quarantine, lifecycle",
    "producers/_lifecycle.py": "the fault switch lifecycle_outside_transaction's deliberately wrong path only (a "
    "separate producer after the commit); the owner never builds it with the switch off",
    "producers/_txproducer.py": "the appender's transactional producer behind its interface (the confluent-kafka "
    "adapter and the fault-injecting one): called only by the appender",
    "services/_cli_demo.py": "the demo's own non-authoritative topic (still transactional)",
    "client/_inbox.py": "the client's idempotent inbox producer (proposals, commands): not authoritative",
    "services/_doctor.py": "settled doctor's clock probes to its own scratch topic <namespace>.doctor: read by nobody",
    "producers/_stream.py": "the provisional stream's idempotent producer (issue 19): parts published before any "
    "commit, outside transactions on purpose; not authoritative, nothing is decided from it",
}


def _produce_sites(root: Path) -> dict[str, list[int]]:
    sites: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in {"produce", "Producer", "SerializingProducer"}:
                sites.setdefault(str(path.relative_to(root)), []).append(node.lineno)
    return sites


def test_only_the_appender_produces_authoritative_records() -> None:
    outside = {f: lines for f, lines in _produce_sites(PACKAGE).items() if f not in ALLOWED}
    assert outside == {}, f"produce paths outside the transactional appender: {outside}"


def test_the_scan_finds_produce_calls(tmp_path: Path) -> None:
    (tmp_path / "rogue.py").write_text("from confluent_kafka import Producer\np = Producer({})\np.produce('t', b'x')\n")
    assert _produce_sites(tmp_path) == {"rogue.py": [2, 3]}


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_allowed_modules_exist(module: str) -> None:
    assert (PACKAGE / module).exists(), f"{module} is allowed to produce but does not exist: update ALLOWED"
