"""The tool server's rules, independent of HTTP: worlds, idempotency keys, owner epochs, the ledger (issue 8, item 3).

A call is decided in this order, under one lock, so concurrent requests are serialised:

1. the conversation must exist (``unknown_conversation``) and the method must belong to one of its classes
   (``unknown_method``; nothing runs and nothing is recorded);
2. an owner epoch lower than the highest one already seen for the conversation is refused (``stale_epoch``,
   docs/design.md §3: a fenced former owner must not change the world);
3. when the method is deduplicated (dedup on and its class not named in ``--no-idempotency``) and the key is in the
   ledger: the same method and arguments get the stored result without running (a replay); anything else is
   refused (``idempotency_key_conflict``);
4. otherwise the backend runs, and the world, epoch, ledger row and execution row are committed in one SQLite
   transaction before the answer (:class:`ToolServerStore`).

The request fingerprint is the SHA-256 of the method and the arguments as JSON with sorted keys, so an int and a
float argument differ (``15`` is not ``15.0``), as they do for the backend.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from settled_bfcl._backends import BACKEND_CLASSES, World, check_bfcl_version, method_index
from settled_bfcl._errors import (
    ConversationConflictError,
    IdempotencyConflictError,
    StaleEpochError,
    ToolServerError,
    UnknownConversationError,
    UnknownMethodError,
)
from settled_bfcl._store import ToolServerStore
from settled_bfcl._wire import (
    CallRequest,
    CallResponse,
    Capabilities,
    ConversationInfo,
    CreateConversationRequest,
    LedgerRecord,
    ToolInfo,
)

__all__ = ["ToolServerConfig", "ToolService", "request_fingerprint"]


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def request_fingerprint(method: str, arguments: dict[str, Any]) -> str:
    """Return the fingerprint that decides "same key, same call" (int and float arguments differ).

    Args:
        method: The method name.
        arguments: The JSON arguments.

    Returns:
        A hex SHA-256 digest.
    """
    return hashlib.sha256(_canonical_json({"method": method, "arguments": arguments}).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ToolServerConfig:
    """The tool server's switches.

    Attributes:
        dedup: False for the negative control: every call runs, a repeated key included.
        non_idempotent_classes: Backend classes whose calls are never deduplicated and are reported as not
            idempotent, so settled makes their interrupted calls Unknown (docs/design.md §5).
    """

    dedup: bool = True
    non_idempotent_classes: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        """Check the class names.

        Raises:
            ValueError: A name is not one of the eight backend classes.
        """
        unknown = sorted(self.non_idempotent_classes - set(BACKEND_CLASSES))
        if unknown:
            raise ValueError(
                f"non_idempotent_classes: unknown backend classes {unknown}; known: {', '.join(BACKEND_CLASSES)}"
            )

    def idempotent(self, class_name: str) -> bool:
        """Tell whether calls of a class are deduplicated under their key.

        Args:
            class_name: A backend class.

        Returns:
            True when dedup is on and the class is not in :attr:`non_idempotent_classes`.
        """
        return self.dedup and class_name not in self.non_idempotent_classes


class ToolService:
    """The worlds of many conversations behind one lock, persisted in a :class:`ToolServerStore`."""

    def __init__(
        self, store: ToolServerStore, config: ToolServerConfig, *, clock: Callable[[], str] = _utc_now
    ) -> None:
        """Serve the worlds kept in a store.

        Args:
            store: The opened store (worlds are loaded from it lazily, so a restart resumes where it stopped).
            config: The switches.
            clock: Returns the current time as an ISO-8601 UTC string.
        """
        self._store = store
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._worlds: dict[str, World] = {}
        self._bfcl_version = check_bfcl_version()

    @property
    def config(self) -> ToolServerConfig:
        """The switches."""
        return self._config

    def capabilities(self) -> Capabilities:
        """Describe dedup and the idempotency of every method.

        Returns:
            The capabilities.
        """
        tools = [
            ToolInfo(method=spec.name, class_name=spec.class_name, idempotent=self._config.idempotent(spec.class_name))
            for spec in sorted(method_index().values(), key=lambda s: (s.class_name, s.name))
        ]
        return Capabilities(
            dedup=self._config.dedup,
            non_idempotent_classes=sorted(self._config.non_idempotent_classes),
            tools=tools,
            bfcl_version=self._bfcl_version,
        )

    def _info(self, conversation_id: str, *, created: bool = False) -> ConversationInfo:
        row = self._store.conversation(conversation_id)
        if row is None:
            raise UnknownConversationError(
                "unknown_conversation", 404, f"no world for conversation {conversation_id!r}; create it first"
            )
        return ConversationInfo(
            conversation_id=conversation_id,
            entry_id=row.entry_id,
            involved_classes=list(row.spec["involved_classes"]),
            long_context=bool(row.spec["long_context"]),
            created=created,
            max_epoch=row.max_epoch,
            executions=row.executions,
        )

    def conversation(self, conversation_id: str) -> ConversationInfo:
        """Describe one conversation.

        Args:
            conversation_id: The conversation.

        Returns:
            Its info.

        Raises:
            UnknownConversationError: No world exists for it.
        """
        with self._lock:
            return self._info(conversation_id)

    def create_conversation(self, conversation_id: str, request: CreateConversationRequest) -> ConversationInfo:
        """Build and store a conversation's world; creating it again with the same spec is a no-op.

        Args:
            conversation_id: The conversation.
            request: The entry id, classes, initial config and long-context flag.

        Returns:
            Its info (``created`` tells whether this call built it).

        Raises:
            ConversationConflictError: It exists with another spec.
            ToolServerError: ``invalid_request`` when a class is not a backend class.
        """
        spec = request.model_dump(mode="json")
        with self._lock:
            existing = self._store.conversation(conversation_id)
            if existing is not None:
                if _canonical_json(existing.spec) != _canonical_json(spec):
                    raise ConversationConflictError(
                        "conversation_conflict",
                        409,
                        f"conversation {conversation_id!r} exists with entry {existing.entry_id!r} and another "
                        "initial_config, class list or long-context flag",
                    )
                return self._info(conversation_id)
            try:
                world = World.from_config(
                    request.initial_config, request.involved_classes, long_context=request.long_context
                )
            except UnknownMethodError as exc:
                raise ToolServerError("invalid_request", 422, f"conversation {conversation_id!r}: {exc}") from exc
            self._store.insert_conversation(conversation_id, request.entry_id, spec, world, self._clock())
            self._worlds[conversation_id] = world
            return self._info(conversation_id, created=True)

    def _world(self, conversation_id: str) -> World:
        world = self._worlds.get(conversation_id)
        if world is None:
            world = self._store.load_world(conversation_id)
            self._worlds[conversation_id] = world
        return world

    def call(self, conversation_id: str, request: CallRequest) -> CallResponse:
        """Execute one call under the rules in the module docstring.

        Args:
            conversation_id: The conversation.
            request: Method, arguments, idempotency key, owner epoch and call id.

        Returns:
            The output, and whether it was replayed from the ledger.

        Raises:
            UnknownConversationError: No world exists for the conversation.
            ToolServerError: ``unknown_method`` when no involved class defines the method.
            StaleEpochError: The epoch is lower than one already seen for the conversation.
            IdempotencyConflictError: The key was used for another method or other arguments.
        """
        with self._lock:
            row = self._store.conversation(conversation_id)
            if row is None:
                raise UnknownConversationError(
                    "unknown_conversation", 404, f"no world for conversation {conversation_id!r}; create it first"
                )
            spec = method_index().get(request.method)
            if spec is None or spec.class_name not in row.spec["involved_classes"]:
                raise ToolServerError(
                    "unknown_method",
                    422,
                    f"conversation {conversation_id!r} offers no method {request.method!r} "
                    f"(its classes: {', '.join(row.spec['involved_classes'])}); nothing was executed",
                )
            if request.owner_epoch < row.max_epoch:
                raise StaleEpochError(
                    "stale_epoch",
                    409,
                    f"conversation {conversation_id!r}: owner epoch {request.owner_epoch} is lower than epoch "
                    f"{row.max_epoch} already seen; call {request.idempotency_key!r} refused, nothing was executed",
                )
            idempotent = self._config.idempotent(spec.class_name)
            fingerprint = request_fingerprint(request.method, request.arguments)
            if idempotent:
                stored = self._store.fingerprint_and_result(conversation_id, request.idempotency_key)
                if stored is not None:
                    stored_fingerprint, output, executed_at, count = stored
                    if stored_fingerprint != fingerprint:
                        raise IdempotencyConflictError(
                            "idempotency_key_conflict",
                            409,
                            f"conversation {conversation_id!r}: idempotency key {request.idempotency_key!r} was "
                            f"used for another call; {request.method}({_canonical_json(request.arguments)}) refused, "
                            "nothing was executed",
                        )
                    self._store.record_replay(conversation_id, request.idempotency_key, request.owner_epoch)
                    return CallResponse(
                        output=output,
                        replayed=True,
                        execution_count=count,
                        idempotent=True,
                        idempotency_key=request.idempotency_key,
                        executed_at=executed_at,
                    )
            world = self._world(conversation_id)
            output = world.execute(request.method, request.arguments)
            executed_at = self._clock()
            try:
                count = self._store.record_execution(
                    conversation_id=conversation_id,
                    key=request.idempotency_key,
                    call_id=request.call_id,
                    method=request.method,
                    class_name=spec.class_name,
                    arguments_json=_canonical_json(request.arguments),
                    fingerprint=fingerprint,
                    output=output,
                    owner_epoch=request.owner_epoch,
                    executed_at=executed_at,
                    world=world,
                )
            except BaseException:
                # The in-memory world ran a call that was not committed: reload it from the store next time.
                del self._worlds[conversation_id]
                raise
            return CallResponse(
                output=output,
                replayed=False,
                execution_count=count,
                idempotent=idempotent,
                idempotency_key=request.idempotency_key,
                executed_at=executed_at,
            )

    def ledger(self, conversation_id: str, key: str | None = None) -> list[LedgerRecord]:
        """Answer "was key K executed, and with what result?" (the operator's step that resolves Unknowns).

        Args:
            conversation_id: The conversation.
            key: One idempotency key, or None for the whole conversation.

        Returns:
            The ledger records; empty when the key never ran.

        Raises:
            UnknownConversationError: No world exists for the conversation.
        """
        with self._lock:
            self._info(conversation_id)
            return self._store.ledger(conversation_id, key)

    def conversation_ids(self) -> Iterable[str]:
        """Return every conversation id the store holds.

        Returns:
            The ids, sorted.
        """
        with self._lock:
            return self._store.conversation_ids()
