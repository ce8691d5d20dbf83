"""``Client.resolve_unknown``'s argument checks and the resolver key files (DUR-009; docs/design.md §4, §5).

Every check here fails before anything is produced: the client is built on an unreachable bootstrap address (the
producer and the receipts reader are created only by the first request), so a check that let a bad command through
would fail with a broker error, not the `ValueError` / `TypeError` asserted.
"""

from __future__ import annotations

import base64
import os
import re
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from settled._settings import Settings
from settled.client import (
    AbortOutcomeUnknownError,
    AbortRejectedError,
    Client,
    CommandOutcomeUnknownError,
    CommandRejectedError,
    PayloadTooLargeError,
    ResolveOutcomeUnknownError,
    ResolveRejectedError,
    SigningKeyError,
    load_signing_key,
    public_key_b64,
    write_signing_key,
)
from settled.schemas import Receipt, ReceiptOutcome, RequestKind

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


@pytest.fixture
def client() -> Iterator[Client]:
    with Client(Settings(kafka_bootstrap="127.0.0.1:1", namespace="unit"), default_timeout_s=1.0) as c:
        yield c


def _resolve(client: Client, **overrides: Any) -> Receipt:
    args: dict[str, Any] = {
        "conversation_id": "conv",
        "submission_id": "sub",
        "call_id": "call",
        "kind": "call_outcome",
        "signing_key": KEY,
        "key_id": "ops",
        "result": {"ok": True},
    }
    args.update(overrides)
    if args["result"] is ...:  # ``result=...``: leave the argument out
        del args["result"]
    return client.resolve_unknown(args.pop("conversation_id"), args.pop("submission_id"), args.pop("call_id"), **args)


@pytest.mark.parametrize("field", ["conversation_id", "submission_id", "call_id", "key_id", "command_id", "principal"])
def test_an_empty_id_is_named(client: Client, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} must not be empty"):
        _resolve(client, **{field: "  "})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kind": "maybe"}, "kind must be one of outcome_for_submission, call_outcome, safe_to_retry, got 'maybe'"),
        ({"kind": "call_outcome", "result": ...}, "result is required when kind is call_outcome"),
        ({"kind": "call_outcome", "outcome": "completed"}, "outcome is only for kind outcome_for_submission"),
        ({"kind": "call_outcome", "reply": "hi"}, "reply is only for kind outcome_for_submission"),
        ({"kind": "call_outcome", "result": {1, 2}}, "result is not JSON-compatible"),
        ({"kind": "safe_to_retry"}, "result is only for kind call_outcome"),
        ({"kind": "outcome_for_submission", "result": ...}, "outcome is required when kind is outcome_for_submission"),
        ({"kind": "outcome_for_submission", "outcome": "done", "result": ...}, "outcome must be one of"),
        ({"kind": "outcome_for_submission", "outcome": "completed"}, "result is only for kind call_outcome"),
        (
            {"kind": "outcome_for_submission", "outcome": "failed", "result": ..., "reply": "r"},
            "reply is only recorded with outcome completed, got outcome failed",
        ),
        ({"timeout_s": 0}, "timeout_s must be positive"),
    ],
)
def test_kind_specific_fields_are_checked_before_sending(
    client: Client, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _resolve(client, **overrides)


def test_the_signing_key_must_be_an_ed25519_private_key(client: Client) -> None:
    with pytest.raises(TypeError, match=r"signing_key must be an Ed25519PrivateKey .* got Ed25519PublicKey"):
        _resolve(client, signing_key=KEY.public_key())
    with pytest.raises(TypeError, match="got bytes"):
        _resolve(client, signing_key=bytes(range(32)))


def test_an_oversized_result_is_refused_before_sending() -> None:
    settings = Settings(kafka_bootstrap="127.0.0.1:1", namespace="unit")
    with Client(settings, max_payload_bytes=500) as small, pytest.raises(PayloadTooLargeError) as err:
        _resolve(small, result="x" * 600)
    assert err.value.limit_bytes == 500 and err.value.size_bytes > 600
    assert str(err.value).startswith("resolution to conversation 'conv' refused before producing: the encoded command")


# ----------------------------------------------------------------------------------------------- errors


def _receipt(request_id: str, reason: str) -> Receipt:
    return Receipt(
        request_kind=RequestKind.COMMAND,
        request_id=request_id,
        outcome=ReceiptOutcome.REJECTED,
        reason=reason,
        conversation_id="conv",
        decided_at=datetime.now(UTC),
    )


def test_command_errors_share_their_bases_and_keep_the_abort_messages() -> None:
    rejected = ResolveRejectedError(_receipt("cmd-1", "unauthorized: key id 'x' is not a configured resolver key"))
    assert isinstance(rejected, CommandRejectedError) and not isinstance(rejected, AbortRejectedError)
    assert (rejected.reason_code, rejected.detail) == ("unauthorized", "key id 'x' is not a configured resolver key")
    assert str(rejected) == (
        "resolution command cmd-1 in conversation 'conv' was rejected: unauthorized: key id 'x' is not a configured "
        "resolver key"
    )
    abort = AbortRejectedError(_receipt("cmd-2", "unknown_target: no such submission"))
    assert isinstance(abort, CommandRejectedError)
    assert str(abort) == "abort command cmd-2 in conversation 'conv' was rejected: unknown_target: no such submission"

    unknown = ResolveOutcomeUnknownError("cmd-3", "conv", "sub", "call-9", 2.0)
    assert isinstance(unknown, CommandOutcomeUnknownError) and isinstance(unknown, TimeoutError)
    assert (unknown.command_id, unknown.submission_id, unknown.call_id) == ("cmd-3", "sub", "call-9")
    assert "to resolution command cmd-3 for call call-9 of submission sub of conversation 'conv'" in str(unknown)
    assert "same command id 'cmd-3'" in str(unknown)
    assert str(AbortOutcomeUnknownError("cmd-4", "conv", "sub", 2.0)) == (
        "no reply within 2 s to abort command cmd-4 for submission sub of conversation 'conv': its outcome is "
        "unknown. Sending the abort again with the same command id 'cmd-4' is answered as a duplicate if the first "
        "one was applied."
    )


# ------------------------------------------------------------------------------------------------- keys


def test_a_pem_key_and_a_base64_raw_key_load_to_the_same_key(tmp_path: Path) -> None:
    pem = tmp_path / "k.pem"
    pem.write_bytes(KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    raw = tmp_path / "k.b64"
    raw.write_text(base64.b64encode(KEY.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())).decode() + "\n")
    want = KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    for path in (pem, raw):
        assert load_signing_key(path).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) == want


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "the file is empty"),
        (b"not base64 at all!", "neither PEM nor base64"),
        (base64.b64encode(bytes(31)), "base64 of 31 bytes; an Ed25519 private key is 32 raw bytes"),
        (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "not a readable PEM private key"),
        (
            KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"pw")),
            "an encrypted PEM key is not supported",
        ),
        (
            generate_private_key(SECP256R1()).private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()),
            r"the PEM key is \w*EC\w*, not an Ed25519 private key",
        ),
    ],
)
def test_a_bad_key_file_is_a_clear_error_naming_the_path(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "bad.key"
    path.write_bytes(content)
    with pytest.raises(SigningKeyError, match=f"signing key file '{re.escape(str(path))}': {problem}") as err:
        load_signing_key(path)
    assert err.value.path == str(path)


def test_a_missing_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SigningKeyError, match=r"missing\.key': cannot be read: No such file"):
        load_signing_key(tmp_path / "missing.key")


def test_write_signing_key_makes_an_owner_only_pem_it_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "resolver.pem"
    old = os.umask(0)  # the file must be 0600 whatever the umask
    try:
        key = write_signing_key(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    loaded = load_signing_key(path)
    b64 = public_key_b64(loaded)
    assert b64 == public_key_b64(key)
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(b64))
    public.verify(loaded.sign(b"m"), b"m")  # the printed public key verifies what the file's key signs
    before = path.read_bytes()
    with pytest.raises(SigningKeyError, match="already exists; refusing to overwrite a key"):
        write_signing_key(path)
    assert path.read_bytes() == before
