"""A submitter that knows nothing of settled: confluent-kafka, fastavro and the shipped ``.avsc`` files (issue 5).

Run as a script (``python tests/integration/plain_avro_producer.py ...``), never imported by settled code: it proves
that any Avro producer can submit from the contract alone (docs/design.md §2, §7). It reads every ``.avsc`` of
``settled/schemas/avsc/`` as plain JSON, encodes a ``SubmissionProposed`` with Avro's single-object encoding
(``C3 01``, the 8-byte little-endian CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form, then the
binary body), computes ``payload_digest`` as documented in the schema (SHA-256 of the canonical payload: see
``digest_payload`` below) and produces it keyed by the conversation id with the partitioner it is told to use.
It prints one JSON line: the partition and offset the record landed on, and the fingerprint it used. It exits 3
if anything imported ``settled``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

AVSC = Path(__file__).resolve().parents[2] / "settled" / "schemas" / "avsc"


def load_schema(full_name: str) -> tuple[Any, bytes]:
    """Parse every ``.avsc`` (dependencies first, by retrying) and return ``full_name``'s parsed schema + fingerprint.

    Args:
        full_name: E.g. ``dev.settled.v1.SubmissionProposed``.

    Returns:
        The expanded parsed schema and its 8 fingerprint bytes (little-endian, as single-object encoding wants).
    """
    sources = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(AVSC.glob("*.avsc"))]
    named: dict[str, Any] = {}
    pending = sources
    while pending:
        left = []
        for src in pending:
            try:
                parse_schema(src, named_schemas=named)
            except Exception:  # noqa: BLE001 - an unknown referenced type: parse it after its dependencies
                left.append(src)
        if len(left) == len(pending):
            raise SystemExit(f"cannot resolve the references of {[s['name'] for s in left]}")
        pending = left
    source = next(s for s in sources if f"{s['namespace']}.{s['name']}" == full_name)
    expanded = parse_schema(source, named_schemas=dict(named), expand=True)
    canonical = to_parsing_canonical_form(expanded)
    return parse_schema(source, named_schemas=dict(named)), bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


def canonical_json(value: Any) -> str:
    """RFC 8785 for the plain values used here (strings, integers, lists, objects): sorted keys, no blanks."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest_payload(input_json: str, tools_offered: list[str]) -> str:
    """``payload_digest``: hex SHA-256 of the canonical JSON of ``{"input": <input>, "tools_offered": [...]}``."""
    return hashlib.sha256(
        canonical_json({"input": json.loads(input_json), "tools_offered": tools_offered}).encode()
    ).hexdigest()


def main() -> None:
    """Produce one proposal; print where it landed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--conversation", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--input-json", required=True)
    ap.add_argument("--principal", default="plain-avro")
    ap.add_argument("--submission-id", default="")
    ap.add_argument("--partitioner", default="murmur2_random")
    ap.add_argument("--wait-stdin", action="store_true", help="Encode and connect, then produce on a stdin line.")
    args = ap.parse_args()
    schema, fp = load_schema("dev.settled.v1.SubmissionProposed")
    input_json = canonical_json(json.loads(args.input_json))
    record = {
        "schema_version": 1,
        "submission_id": args.submission_id or str(uuid.uuid4()),
        "principal": args.principal,
        "conversation_id": args.conversation,
        "idempotency_key": args.key,
        "payload": {"input_json": input_json, "tools_offered": []},
        "payload_digest": digest_payload(input_json, []),
        "proposed_at": datetime.now(UTC),
    }
    body = io.BytesIO()
    schemaless_writer(body, schema, record)
    value = b"\xc3\x01" + fp + body.getvalue()
    producer = Producer(
        {"bootstrap.servers": args.bootstrap, "partitioner": args.partitioner, "enable.idempotence": True}
    )
    landed: dict[str, int] = {}
    if args.wait_stdin:
        producer.list_topics(args.topic, timeout=30)  # connected: producing is all that is left
        print("ready", flush=True)
        sys.stdin.readline()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            raise SystemExit(f"delivery failed: {err}")
        landed.update(partition=msg.partition(), offset=msg.offset())

    producer.produce(args.topic, key=args.conversation.encode(), value=value, on_delivery=on_delivery)
    if producer.flush(30) != 0 or not landed:
        raise SystemExit("the record was not delivered within 30 s")
    if any(name == "settled" or name.startswith("settled.") for name in sys.modules):
        sys.exit(3)
    print(json.dumps({**landed, "submission_id": record["submission_id"], "fingerprint": fp.hex()}))


if __name__ == "__main__":
    main()
