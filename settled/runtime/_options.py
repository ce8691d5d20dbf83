"""How runs execute effects (`RunOptions`), shared by the façade, the commit pipeline and tool-call execution."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from settled.producers import StreamPublisher

__all__ = ["RunOptions"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class RunOptions:
    """How runs execute effects.

    Attributes:
        clock: The clock ``ctx.now()`` reads (aware UTC); tests may offset it.
        abort_grace_s: After an abort (or any cancellation), how long a call in flight may still return and
            settle before the run stops with it in doubt (docs/design.md §5).
        max_result_bytes: Largest canonical tool or step result recorded inline; a larger tool result is recorded
            as the error ``result_too_large`` with its digest (a larger step result fails the step, larger tool
            arguments fail the call before anything is recorded).
        retry_backoff_s: First delay between retries of an in-doubt idempotent call (doubling, at most 2 s).
        delta_flush_every: A model response's text and reasoning deltas are recorded (canonical audit content)
            every this many deltas, and the rest with the completed response; 0 records no deltas
            (docs/semantics.md §9).
        model_retries: Retries of one model call after a retryable provider error (the per-operation budget).
        model_backoff_s: First delay between model retries when the provider gave none (doubling).
        settle_linger_s: How long a posted record (a tool's settlement, a pure step's result), which the run does
            not wait for, may wait for the run's next record to share its transaction (docs/design.md §3: "records
            produced within a few milliseconds' linger"); with an instant model that makes one commit a call. 0
            hands it over at once.
        stream: Where ``ctx.emit`` parts and model text deltas are published as they happen (the provisional
            ``<ns>.stream``, issue 19); the worker sets it, None publishes nothing.
        stream_flush_s: How long an attempt waits, before it returns its reply, for its parts to reach the stream
            (so a follower that sees the settlement has them), in seconds.
    """

    clock: Callable[[], datetime] = _utcnow
    abort_grace_s: float = 5.0
    max_result_bytes: int = 262_144
    retry_backoff_s: float = 0.05
    delta_flush_every: int = 16
    model_retries: int = 3
    model_backoff_s: float = 0.5
    settle_linger_s: float = 0.002
    stream: StreamPublisher | None = None
    stream_flush_s: float = 5.0
