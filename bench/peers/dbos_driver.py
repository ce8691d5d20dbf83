"""DBOS side of ``bench/side_by_side.py``: one workflow of K ``@DBOS.step`` calls, driven by in-process calls.

Runs in the peers' venv (``bench/peers/install.sh``), never in settled's. One JSON argument ``{mode, dsn, k, ...}``;
prints one JSON line per event to stdout:

- ``latency`` (``warmup``, ``turns``): ``{"latencies_ms": [...]}``, sequential turns, a fresh workflow id each;
- ``throughput`` (``inflight``, ``warmup_s``, ``window_s``): ``{"event": "window-start"}`` then
  ``{"event": "window-end", "turns": n}`` (turns whose result a caller got inside the window);
- ``crash-start`` (``id``, ``counter``, ``sleep_step``, ``sleep_s``): starts that workflow and waits (the
  benchmark kills this process mid-step);
- ``crash-recover`` (``id``): launches DBOS (which recovers the pending workflow) and prints
  ``{"event": "done", "result": ...}`` once the workflow's result is read.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from typing import Any

from dbos import DBOS, SetWorkflowID


@DBOS.step()
def step_body(index: int, value: str, counter: str | None, sleep_step: int, sleep_s: float) -> str:
    """One durable step: an identity function; a crash case logs each execution (fsynced) and may sleep."""
    if counter:
        with open(counter, "a", encoding="utf-8") as out:
            out.write(f"step {index}\n")
            out.flush()
            os.fsync(out.fileno())
    if index == sleep_step:
        time.sleep(sleep_s)
    return value


@DBOS.workflow()
def turn(k: int, counter: str | None = None, sleep_step: int = 0, sleep_s: float = 0.0) -> str:
    """A turn: K steps, each checkpointed in PostgreSQL before the next starts."""
    value = "hello"
    for index in range(1, k + 1):
        value = step_body(index, value, counter, sleep_step, sleep_s)
    return value


def emit(obj: dict[str, Any]) -> None:
    """Print one JSON event line."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def one_turn(k: int) -> None:
    """Run one turn under a fresh workflow id and check its result."""
    with SetWorkflowID(str(uuid.uuid4())):
        result = turn(k)
    if result != "hello":
        raise RuntimeError(f"unexpected result {result!r}")


def main() -> None:
    """Launch DBOS on the given PostgreSQL and run the mode."""
    cfg = json.loads(sys.argv[1])
    DBOS(config={"name": "bench", "system_database_url": cfg["dsn"], "sys_db_pool_size": 64, "log_level": "WARNING"})
    DBOS.launch()
    mode = cfg["mode"]
    if mode == "latency":
        for _ in range(cfg["warmup"]):
            one_turn(cfg["k"])
        out = []
        for _ in range(cfg["turns"]):
            t0 = time.perf_counter()
            one_turn(cfg["k"])
            out.append((time.perf_counter() - t0) * 1000)
        emit({"latencies_ms": out})
    elif mode == "throughput":
        state = {"counting": False, "stop": False, "turns": 0}
        lock = threading.Lock()

        def loop() -> None:
            while not state["stop"]:
                one_turn(cfg["k"])
                with lock:
                    if state["counting"] and not state["stop"]:
                        state["turns"] += 1

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(cfg["inflight"])]
        for t in threads:
            t.start()
        time.sleep(cfg["warmup_s"])
        state["counting"] = True
        emit({"event": "window-start"})
        time.sleep(cfg["window_s"])
        with lock:
            state["stop"] = True
            counted = state["turns"]
        emit({"event": "window-end", "turns": counted})
        for t in threads:
            t.join(60)
    elif mode == "crash-start":
        with SetWorkflowID(cfg["id"]):
            DBOS.start_workflow(turn, cfg["k"], cfg["counter"], cfg["sleep_step"], cfg["sleep_s"])
        emit({"event": "started"})
        time.sleep(3600)
    elif mode == "crash-recover":
        result = DBOS.retrieve_workflow(cfg["id"]).get_result()
        emit({"event": "done", "result": result})
    else:
        raise ValueError(f"mode {mode!r} is not one of latency, throughput, crash-start, crash-recover")
    DBOS.destroy()


if __name__ == "__main__":
    main()
