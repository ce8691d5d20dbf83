"""Run the BFCL tool server: ``python -m settled_bfcl.toolserver --db PATH --port N [switches]``.

Switches:
    ``--no-dedup``: the negative control; a repeated idempotency key executes again.
    ``--no-idempotency TradingBot,TravelAPI``: those classes are not deduplicated and are reported as not
    idempotent, so settled makes their interrupted calls Unknown (docs/design.md §5).

The server listens on 127.0.0.1 by default and keeps everything in the SQLite file named by ``--db``; restarting it
on the same file resumes every world and the ledger.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from settled_bfcl._backends import BACKEND_CLASSES
from settled_bfcl._server import create_app
from settled_bfcl._service import ToolServerConfig, ToolService
from settled_bfcl._store import ToolServerStore

__all__ = ["main", "parse_args"]


def _class_list(text: str) -> frozenset[str]:
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(names - set(BACKEND_CLASSES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown backend classes {unknown}; known: {', '.join(BACKEND_CLASSES)}")
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Args:
        argv: The arguments (``sys.argv[1:]`` when None).

    Returns:
        The parsed namespace (``db``, ``host``, ``port``, ``no_dedup``, ``no_idempotency``, ``log_level``).
    """
    parser = argparse.ArgumentParser(
        prog="python -m settled_bfcl.toolserver",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", type=Path, required=True, help="SQLite file holding worlds and the ledger")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--no-dedup", action="store_true", help="execute every call, a repeated key included")
    parser.add_argument(
        "--no-idempotency",
        type=_class_list,
        default=frozenset(),
        metavar="CLASSES",
        help="comma-separated backend classes that are not deduplicated and are reported as not idempotent",
    )
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Open the store and serve until interrupted.

    Args:
        argv: The arguments (``sys.argv[1:]`` when None).
    """
    args = parse_args(argv)
    config = ToolServerConfig(dedup=not args.no_dedup, non_idempotent_classes=args.no_idempotency)
    store = ToolServerStore.open(args.db)
    try:
        app = create_app(ToolService(store, config))
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    finally:
        store.close()


if __name__ == "__main__":
    main()
