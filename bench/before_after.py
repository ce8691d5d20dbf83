"""Before/after: `bench/rebuild.py` and `bench/engine.py` on a git ref and on this checkout, alternating pairwise.

    python bench/before_after.py [--ref main] [--pairs 3] [--events 20k,50k] [--engine-args "..."]
    python bench/before_after.py --suite records [--ref REF] [--pairs 3] [--records-args "..."]
    python bench/before_after.py --suite k0 [--ref REF] [--pairs 3] [--k0-args "--turns 500"]

A refactor that must not slow settled down (issue 15) is measured here: the ref is exported with ``git archive`` into
a temporary folder, and each pair runs the ref's benchmarks and this checkout's back to back, the order swapped every
other pair, so a machine whose load drifts affects both sides alike. Each run has ``PYTHONPATH`` and its working
folder set to its own tree, so the benchmark and every process it starts import that tree's ``settled``.

It prints, per figure, each side's median and min-max over the pairs and the median of the pairwise after/before
ratios with their range; the noise to compare a ratio with is the before side's own spread (max / min). Figures: the
rebuild's consume, consume + decode and rebuild events/s per size (``--no-lag``) and its replay CPU per batch and
CPU-bound events/s (CPU time, which other processes on a shared machine do not stretch), and the engine's bare
commit p50 and, per model, the settled p50 per call and the 1- and N-conversation calls/s.

``--suite k0`` runs `bench/k0_tail.py` (sequential K=0 turns on the session's broker, hop by hop; issue 24) and
compares the turn's p50/p90/p99 and each hop's median. The script and its app are this checkout's on both sides
(copied over the ref's tree), so only the product code differs.

``--suite records`` runs `bench/records_per_txn.py` ``--part worker`` instead (the throughput case on a private broker,
issue 24 item 3; the ref must have that script) and compares its figures: turns/s, steps/s, transactions/s, records
per transaction, worker and broker CPU per turn, the loop's share of time in Kafka calls.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_SIZE = re.compile(r"^fill ([\d,]+) events")
_REBUILD = re.compile(r"^\s+(consume|consume \+ decode|rebuild) ([\d,]+) ev/s")
_US = re.compile(r"\(([\d.]+) us\)")
_BARE = re.compile(r"^bare transactional commit: p50 ([\d.]+) ms")
_ROW = re.compile(r"^\|\s*(instant|100 ms)\s*\|([^|]*)\|([^|]*)\|([^|]*)\|([^|]*)\|([^|]*)\|([^|]*)\|([^|]*)\|")


def _export(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(HERE), "archive", ref], check=True, capture_output=True).stdout
    tree = into / "before"
    tree.mkdir()
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(tree, filter="data")
    return tree


def _run(tree: Path, argv: list[str], log: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True, check=False)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} in {tree} exited {done.returncode}; output in {log}")
    return done.stdout + done.stderr  # rebuild.py reports its progress figures on stderr


def _figures(rebuild_out: str, engine_out: str) -> dict[str, float]:
    out: dict[str, float] = {}
    size = "?"
    for line in rebuild_out.splitlines():
        if m := _SIZE.match(line):
            size = m.group(1)
        elif m := _REBUILD.match(line):
            out[f"rebuild {size}: {m.group(1)} ev/s"] = float(m.group(2).replace(",", ""))
        # The breakdown table: | size | setup | ... | decode (N us) | ... | replay CPU (N us) | CPU-bound ev/s | ...
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 13 and cells[6].endswith("us)") and (m := _US.search(cells[11])):
            out[f"rebuild {cells[0]}: replay CPU us/batch"] = float(m.group(1))
            out[f"rebuild {cells[0]}: CPU-bound ev/s"] = float(cells[12].replace(",", ""))
    for line in engine_out.splitlines():
        if m := _BARE.match(line):
            out["engine: bare commit p50 ms"] = float(m.group(1))
        elif m := _ROW.match(line):
            model = m.group(1)
            out[f"engine {model}: settled p50 ms/call"] = float(m.group(3))
            out[f"engine {model}: 1 conv calls/s"] = float(m.group(7).replace(",", ""))
            out[f"engine {model}: N convs calls/s"] = float(m.group(8).replace(",", ""))
    return out


def main() -> int:
    """Run the pairs and print the table; return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="the 'before' git ref")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--events", default="20k,50k", help="rebuild sizes")
    ap.add_argument(
        "--engine-args", default="--calls 5 --rounds 3 --conversations 10 --bare 50 --bare-paced 10", help="engine.py"
    )
    ap.add_argument("--bootstrap", default=os.environ.get("SETTLED_KAFKA_BOOTSTRAP"))
    ap.add_argument("--suite", choices=("rebuild-engine", "records", "k0"), default="rebuild-engine")
    ap.add_argument("--records-args", default="", help="records_per_txn.py's arguments (its broker is private)")
    ap.add_argument("--k0-args", default="", help="k0_tail.py's arguments")
    args = ap.parse_args()
    boot = ["--bootstrap", args.bootstrap] if args.bootstrap else []
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="settled-before-after-") as tmp:
        trees = {"before": _export(args.ref, Path(tmp)), "after": HERE}
        if args.suite == "k0":  # the same measuring script on both sides: only the product code differs
            for name in ("k0_tail.py", "k0_tail_app.py"):
                shutil.copy(HERE / "bench" / name, trees["before"] / "bench" / name)
        for i in range(args.pairs):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for side in order:
                tree = trees[side]
                logs = Path(tmp)
                if args.suite == "k0":
                    out = logs / f"k0-{side}-{i}.json"
                    argv = ["bench/k0_tail.py", "--json", str(out), *boot]
                    _run(tree, [*argv, *shlex.split(args.k0_args)], logs / f"k0-{side}-{i}.log")
                    runs[side].append(json.loads(out.read_text()))
                    print(f"pair {i + 1}/{args.pairs} {side}: {runs[side][-1]}", flush=True)
                    continue
                if args.suite == "records":
                    out = logs / f"rpt-{side}-{i}.json"
                    argv = ["bench/records_per_txn.py", "--part", "worker", "--json", str(out)]
                    _run(tree, [*argv, *shlex.split(args.records_args)], logs / f"rpt-{side}-{i}.log")
                    figures = json.loads(out.read_text())
                    runs[side].append({k: float(v) for k, v in figures.items() if isinstance(v, int | float)})
                    print(f"pair {i + 1}/{args.pairs} {side}: {runs[side][-1]}", flush=True)
                    continue
                rebuild = _run(
                    tree, ["bench/rebuild.py", "--events", args.events, "--no-lag", *boot], logs / f"r-{side}-{i}.log"
                )
                engine = _run(
                    tree, ["bench/engine.py", *shlex.split(args.engine_args), *boot], logs / f"e-{side}-{i}.log"
                )
                runs[side].append(_figures(rebuild, engine))
                print(f"pair {i + 1}/{args.pairs} {side}: {runs[side][-1]}", flush=True)
    names = sorted(set(runs["before"][0]) & set(runs["after"][0]))
    print(f"\nbefore = {args.ref}, after = this checkout; {args.pairs} pairs, alternating\n")
    print("| figure | before median (min-max) | after median (min-max) | after/before (min-max) | before spread |")
    print("|---|---|---|---|---|")
    for name in names:
        b = [r[name] for r in runs["before"]]
        a = [r[name] for r in runs["after"]]
        ratios = [x / y for x, y in zip(a, b, strict=True) if y] or [float("nan")]  # nan: every before was 0
        spread = max(b) / min(b) if min(b) else float("nan")
        print(
            f"| {name} | {statistics.median(b):,.2f} ({min(b):,.2f}-{max(b):,.2f}) "
            f"| {statistics.median(a):,.2f} ({min(a):,.2f}-{max(a):,.2f}) "
            f"| {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | {spread:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
