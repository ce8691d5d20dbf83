"""Benchmark: HTTP submit → receipt through ``settled api`` beside ``Client.submit()`` (issue 20).

    python bench/api.py [--submissions 400] [--clients 1,50] [--bootstrap HOST:PORT] [--keep]

In a fresh namespace (3 partitions, deleted at the end) it starts a ``settled worker`` (the echo app) and a
``settled api`` child (`settled.testing.ApiProcess`; its tokens table in a fresh schema of ``SETTLED_POSTGRES_DSN``,
dropped at the end). For each client count, in a rotating order:

* **http**: that many threads sharing one ``httpx.Client`` (keep-alive) POST ``/v1/conversations/{cid}/submissions``
  with a new ``Idempotency-Key`` each; latency = request → the 201 receipt;
* **client**: that many threads sharing one ``settled.client.Client`` in this process call ``submit()``; latency =
  call → receipt.

Each thread submits to its own conversation. Printed per side: receipt latency p50/p99 (ms), submissions/s (requests
÷ time from the first request to the last receipt), and http ÷ client ratios. The durability class is the same on both
sides: the receipt is the owner's admission, read back from ``settled.receipts`` (the HTTP side adds the API process's
hop, JSON and the token lookup). Exit status 0 unless a request failed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/api.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    delete_namespace,
    fresh_namespace,
    load_average,
    percentile,
    resolve_bootstrap,
    table,
    use_dev_timeouts,
)

from settled._settings import Settings
from settled.api import Scope, TokenStore
from settled.client import Client
from settled.producers import provision_topics
from settled.schemas import Codec
from settled.testing import ECHO_APP, ApiProcess, WorkerProcess

PARTITIONS = 3


def _run(clients: int, total: int, submit: Callable[[str, str], None]) -> tuple[list[float], float]:
    """Run ``total`` submissions from ``clients`` threads; return per-request latencies (s) and the wall time (s)."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = itertools.count()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        cid = f"bench-{n}-{uuid.uuid4().hex[:6]}"
        while next(counter) < total:
            t0 = time.perf_counter()
            try:
                submit(cid, uuid.uuid4().hex)
            except BaseException as exc:  # noqa: BLE001 - reported and fails the run below
                errors.append(exc)
                return
            with lock:
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed; first: {errors[0]!r}")
    return latencies, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=400, help="Requests per side and client count.")
    parser.add_argument("--clients", default="1,50", help="Client thread counts, comma-separated.")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers.")
    parser.add_argument("--keep", action="store_true", help="Keep the namespace's topics.")
    args = parser.parse_args()
    timeouts = use_dev_timeouts()
    bootstrap, where = resolve_bootstrap(args.bootstrap)
    dsn = Settings().postgres_dsn
    if not dsn:
        sys.stderr.write("bench/api.py: set SETTLED_POSTGRES_DSN (the tokens table lives there)\n")
        return 2
    settings = Settings(
        namespace=fresh_namespace("bench-api"), kafka_bootstrap=bootstrap, postgres_dsn=dsn, partitions=PARTITIONS
    )
    provision_topics(settings, Codec(), datetime.now(UTC))
    schema = f"bench_api_{uuid.uuid4().hex[:10]}"
    token = TokenStore(dsn, f"{schema}__tokens").create("bench", frozenset({Scope.SUBMIT}))[1]
    logs = Path(tempfile.gettempdir()) / settings.namespace
    env = {"SETTLED_PARTITIONS": str(PARTITIONS)}
    worker = WorkerProcess.start(settings, app=ECHO_APP, log_path=logs / "worker.log", worker_id="bench", env=env)
    api = ApiProcess.start(settings, schema=schema, log_path=logs / "api.log", env=env)
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    rows: list[list[str]] = []
    try:
        with (
            Client(settings, principal="bench") as client,
            httpx.Client(
                base_url=api.url,
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
                limits=httpx.Limits(max_connections=max(counts), max_keepalive_connections=max(counts)),
            ) as http,
        ):

            def via_http(cid: str, key: str) -> None:
                answer = http.post(
                    f"/v1/conversations/{cid}/submissions", json={"input": {"n": key}}, headers={"Idempotency-Key": key}
                )
                if answer.status_code != 201:
                    raise RuntimeError(f"HTTP {answer.status_code}: {answer.text}")

            def via_client(cid: str, key: str) -> None:
                client.submit(cid, {"n": key}, idempotency_key=key)

            sides = {"http": via_http, "client": via_client}
            _run(2, 20, via_http)  # warm up both paths: the worker's claims, the API's connections
            _run(2, 20, via_client)
            for i, clients in enumerate(counts):
                order = list(sides) if i % 2 == 0 else list(reversed(sides))
                results: dict[str, tuple[float, float, float]] = {}
                for side in order:
                    latencies, wall = _run(clients, args.submissions, sides[side])
                    results[side] = (
                        percentile(latencies, 50) * 1e3,
                        percentile(latencies, 99) * 1e3,
                        len(latencies) / wall,
                    )
                for side in sides:
                    p50, p99, rate = results[side]
                    rows.append([side, str(clients), f"{p50:.1f}", f"{p99:.1f}", f"{rate:.0f}"])
                h, c = results["http"], results["client"]
                rows.append(
                    ["http ÷ client", str(clients), f"{h[0] / c[0]:.2f}", f"{h[1] / c[1]:.2f}", f"{h[2] / c[2]:.2f}"]
                )
    finally:
        api.stop()
        worker.stop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{schema}__tokens")))
        if not args.keep:
            delete_namespace(settings)
    print(f"bench/api.py: {args.submissions} submissions per side and client count; broker {bootstrap} ({where})")
    print(f"timeouts: {timeouts}; load: {load_average()}")
    print(table(["side", "clients", "receipt p50 ms", "receipt p99 ms", "submissions/s"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
