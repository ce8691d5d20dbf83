"""Worker side of ``bench/k0_tail.py``: the side-by-side's app (`bench.side_by_side_app`), with hop stamps.

``settled worker --app bench.k0_tail_app:app`` with ``SETTLED_BENCH_STAMPS`` naming a file: the worker process appends
one line per event to it, each stamped with ``time.monotonic_ns()`` (one clock for every process of the host, so the
client's stamps line up with these):

* ``run <tag> <begin ns> <end ns>``: the run body (the agent) began and returned (``tag``: the input's);
* ``txn <end ns> <records> <begin_transaction s> <produce s> <flush s> <send_offsets s> <commit s>``: a transaction
  committed (the worker's `settled._metrics.WorkerMetrics` observer; the worker serves metrics for it, so
  ``SETTLED_METRICS_PORT`` must be set);
* ``gc <begin ns> <end ns> <generation> <collected>``: one cyclic garbage collection (``gc.callbacks``).

Nothing here changes what the worker does; each stamp is one ``os.write`` on an ``O_APPEND`` file (a few µs).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Mapping
from typing import Any

from bench.side_by_side_app import agent as _turn_agent
from bench.side_by_side_app import app as _app
from settled._metrics import WorkerMetrics
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


async def agent(ctx: RunContext) -> dict[str, Any]:
    """The side-by-side's turn, stamped: when the run body began and returned."""
    begin_ns = time.monotonic_ns()
    out = await _turn_agent(ctx)
    _stamp(f"run {ctx.input.get('tag', '-')} {begin_ns} {time.monotonic_ns()}")
    return out


#: The side-by-side's app with the stamped agent (its tools and concurrency kept).
app = dataclasses.replace(_app, agent=agent)
