"""The app object agent authors hand to ``settled worker --app package.module:app`` (DESIGN.md §11)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from settled.processors import Agent

__all__ = ["App", "AppLoadError", "load_app"]


class AppLoadError(ValueError):
    """``--app`` does not name an `App` (the message names the reference and what was found)."""


@dataclass(frozen=True)
class App:
    """What a worker runs.

    Attributes:
        agent: The run body: called with an `settled.processors.AgentRun`, returns the final reply as canonical
            JSON, or raises (an uncaught error ends the attempt; ``max_attempts`` bounds the retries).
        max_attempts: Attempts per submission before it settles failed (DESIGN.md §5).
        resolver_keys: Ed25519 public keys (base64 of the raw 32 bytes) allowed to sign ``ResolveUnknown``, by key id.
        concurrency: Runs at once in one worker process (its concurrency permits).
    """

    agent: Agent
    max_attempts: int = 3
    resolver_keys: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 16


def load_app(reference: str) -> App:
    """Import ``package.module:attribute`` and return the `App` it names.

    Args:
        reference: ``"package.module:app"``.

    Returns:
        The app.

    Raises:
        AppLoadError: The reference is malformed, the module or attribute is missing, or it is not an `App`.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(f"--app {reference!r}: expected 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppLoadError(f"--app {reference!r}: cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise AppLoadError(f"--app {reference!r}: {attribute!r} is {type(app).__name__}, not a settled App")
    return app
