"""Resolver signing keys: load, create and describe the Ed25519 keys signing ``ResolveUnknown`` (docs/design.md §4, §5).

Workers hold the public keys (``App.resolver_keys``: key id → base64 of the raw 32 bytes) and verify every
resolution against them (DUR-009); the operator holds the private key in a file, PEM (PKCS#8, as
``openssl genpkey -algorithm ed25519`` writes it) or the base64 of the raw 32 private bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from settled.client._errors import SigningKeyError

__all__ = ["load_signing_key", "public_key_b64", "write_signing_key"]

_PEM_START = b"-----BEGIN"


def load_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Read a resolver's Ed25519 private key from a file (docs/design.md §4).

    Args:
        path: A PEM file (an unencrypted PKCS#8 or OpenSSL ``PRIVATE KEY``), or a text file holding the base64 of
            the raw 32-byte private key (surrounding whitespace ignored).

    Returns:
        The private key.

    Raises:
        SigningKeyError: The file cannot be read, is empty, is an encrypted or non-Ed25519 PEM key, or is neither PEM
            nor base64 of exactly 32 bytes (the message names the path and the problem).
    """
    name = os.fspath(path)
    try:
        data = Path(name).read_bytes()
    except OSError as exc:
        raise SigningKeyError(name, f"cannot be read: {exc.strerror or exc}") from exc
    text = data.strip()
    if not text:
        raise SigningKeyError(name, "the file is empty")
    if text.startswith(_PEM_START):
        try:
            key = load_pem_private_key(text, password=None)
        except TypeError as exc:  # cryptography: "Password was not given but private key is encrypted"
            raise SigningKeyError(name, f"an encrypted PEM key is not supported ({exc})") from exc
        except ValueError as exc:
            raise SigningKeyError(name, f"not a readable PEM private key ({exc})") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError(name, f"the PEM key is {type(key).__name__}, not an Ed25519 private key")
        return key
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SigningKeyError(name, f"neither PEM nor base64 ({exc})") from exc
    if len(raw) != 32:
        raise SigningKeyError(name, f"base64 of {len(raw)} bytes; an Ed25519 private key is 32 raw bytes")
    return Ed25519PrivateKey.from_private_bytes(raw)


def public_key_b64(key: Ed25519PrivateKey) -> str:
    """Return the base64 of a private key's raw 32-byte public key: the value for ``App.resolver_keys``.

    Args:
        key: The private key.

    Returns:
        The base64 text.
    """
    return base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def write_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Create a new Ed25519 private key and write it to a new file, PEM (PKCS#8), readable by its owner only (0600).

    Args:
        path: The file to create; it must not exist (an existing key is never overwritten).

    Returns:
        The new private key.

    Raises:
        SigningKeyError: The file exists or cannot be created.
    """
    name = os.fspath(path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise SigningKeyError(name, "already exists; refusing to overwrite a key") from exc
    except OSError as exc:
        raise SigningKeyError(name, f"cannot be created: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    os.chmod(name, 0o600)  # os.open's mode is masked by the umask: set exactly 0600
    return key
