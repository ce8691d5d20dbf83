"""Worker side of ``bench/k0_tail.py``: the side-by-side's app (`bench.side_by_side_app`), with hop stamps.

``settled worker --app bench.k0_tail_app:app`` with ``SETTLED_BENCH_STAMPS`` naming a file: the worker process appends
one line per event to it, each stamped with ``time.monotonic_ns()`` (one clock for every process of the host, so the
client's stamps line up with these):

* ``run <tag> <begin ns> <end ns> <submission id>``: the run body (the agent) began and returned (``tag``: the
  input's);
* ``txn <end ns> <records> <begin_transaction s> <produce s> <flush s> <send_offsets s> <commit s>``: a transaction
  committed (the worker's `settled._metrics.WorkerMetrics` observer; the worker serves metrics for it, so
  ``SETTLED_METRICS_PORT`` must be set);
* ``gc <begin ns> <end ns> <generation> <collected>``: one cyclic garbage collection (``gc.callbacks``);
* ``poll <ns> <records>``: the worker loop got inbox records from its poll (`settled.processors.Worker`'s
  ``_decide`` began);
* ``launch <submission id> <ns>`` and ``finish <submission id> <ns>``: the conductor began to launch the attempt's
  run, and began to stage its end (`settled.processors.Conductor`'s ``_launch`` and ``_finish``).

With ``SETTLED_BENCH_EOS_DEBUG=1`` the partition owners' transactional producers also log librdkafka's ``eos``
debug lines to the worker's stderr (e.g. an ``AddPartitionsToTxn`` answered ``CONCURRENT_TRANSACTIONS``, which
librdkafka retries after a fixed 20 ms).

With ``SETTLED_BENCH_MIN_GAP_MS=N`` (an experiment, not settled's behaviour) a partition owner's transaction begins no
sooner than N ms after the same owner's previous commit returned (a sleep for the rest), to see what not racing the
coordinator's completion of the previous transaction would cost the p50 and save the p99.

Otherwise nothing here changes what the worker does: the stamped methods are wrapped, each stamp is one ``os.write``
on an ``O_APPEND`` file (a few µs).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Mapping
from typing import Any

import settled.producers._appender as _appender
from bench.side_by_side_app import agent as _turn_agent
from bench.side_by_side_app import app as _app
from settled._metrics import WorkerMetrics
from settled.processors import Conductor, Worker
from settled.runtime import RunContext

_PATH = os.environ.get("SETTLED_BENCH_STAMPS")
_FD = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if _PATH else -1


def _stamp(line: str) -> None:
    if _FD >= 0:
        os.write(_FD, (line + "\n").encode())


_gc_begin_ns = 0


def _on_gc(phase: str, info: dict[str, int]) -> None:
    global _gc_begin_ns
    if phase == "start":
        _gc_begin_ns = time.monotonic_ns()
    else:
        _stamp(f"gc {_gc_begin_ns} {time.monotonic_ns()} {info['generation']} {info['collected']}")


gc.callbacks.append(_on_gc)

_observed = WorkerMetrics.transaction_committed
_CALLS = ("begin_transaction", "produce", "flush", "send_offsets_to_transaction", "commit_transaction")


def _transaction_committed(self: WorkerMetrics, records: int, call_s: Mapping[str, float]) -> None:
    end_ns = time.monotonic_ns()
    _stamp(f"txn {end_ns} {records} " + " ".join(f"{call_s.get(c, 0.0):.6f}" for c in _CALLS))
    _observed(self, records, call_s)


WorkerMetrics.transaction_committed = _transaction_committed  # type: ignore[method-assign]

_decide = Worker._decide
_launch = Conductor._launch
_finish = Conductor._finish


def _stamped_decide(self: Worker[Any], msgs: list[Any]) -> None:
    if msgs:
        _stamp(f"poll {time.monotonic_ns()} {len(msgs)}")
    _decide(self, msgs)


def _stamped_launch(self: Conductor, conversation_id: str, submission_id: str, *args: Any) -> Any:
    _stamp(f"launch {submission_id} {time.monotonic_ns()}")
    return _launch(self, conversation_id, submission_id, *args)


def _stamped_finish(self: Conductor, running: Any, now: Any) -> None:
    _stamp(f"finish {running.run.submission_id} {time.monotonic_ns()}")
    _finish(self, running, now)


if os.environ.get("SETTLED_BENCH_EOS_DEBUG") == "1":
    _config = _appender.producer_config

    def _debug_config(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**_config(*args, **kwargs), "debug": "eos"}

    _appender.producer_config = _debug_config  # type: ignore[assignment]

_MIN_GAP_S = float(os.environ.get("SETTLED_BENCH_MIN_GAP_MS", "0")) / 1000
if _MIN_GAP_S > 0:
    _transaction = _appender.TransactionalAppender._transaction
    _last_commit_s: dict[int, float] = {}

    def _spaced_transaction(self: _appender.TransactionalAppender, *args: Any) -> Any:
        wait_s = _last_commit_s.get(id(self), 0.0) + _MIN_GAP_S - time.monotonic()
        if wait_s > 0:
            time.sleep(wait_s)  # the experiment's spacing, by definition a duration
        try:
            return _transaction(self, *args)
        finally:
            _last_commit_s[id(self)] = time.monotonic()

    _appender.TransactionalAppender._transaction = _spaced_transaction  # type: ignore[method-assign]

Worker._decide = _stamped_decide  # type: ignore[method-assign]
Conductor._launch = _stamped_launch  # type: ignore[method-assign]
Conductor._finish = _stamped_finish  # type: ignore[method-assign]


async def agent(ctx: RunContext) -> dict[str, Any]:
    """The side-by-side's turn, stamped: when the run body began and returned."""
    begin_ns = time.monotonic_ns()
    out = await _turn_agent(ctx)
    _stamp(f"run {ctx.input.get('tag', '-')} {begin_ns} {time.monotonic_ns()} {ctx.submission_id}")
    return out


#: The side-by-side's app with the stamped agent (its tools and concurrency kept).
app = dataclasses.replace(_app, agent=agent)
