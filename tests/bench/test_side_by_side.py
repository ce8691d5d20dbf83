"""bench/side_by_side.py (issue 23): the launcher's network guard and the report's checks.

The guard test needs root (or CAP_NET_ADMIN) and ``unshare``: it builds a fresh network namespace, adds a veth pair in
it, and asks the launcher to start restate-server there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import side_by_side as sbs

ROOT = Path(__file__).resolve().parents[2]

# Runs in the namespace: asks the real launcher to start restate-server (peer paths that do not exist: the guard
# must refuse before anything is started). Exit 3 and the message on refusal; any other error propagates.
_LAUNCH = """
import sys
from pathlib import Path
from bench import side_by_side as sbs
peers = sbs.Peers(Path("/nonexistent/python"), Path("/nonexistent/hypercorn"), Path("/nonexistent/restate-server"),
                  Path("/nonexistent/node"))
try:
    sbs.RestateServer(peers, Path(sys.argv[1])).start()
except sbs.LauncherRefused as exc:
    print(exc)
    sys.exit(3)
"""


def _in_fresh_netns(tmp_path: Path, with_veth: bool) -> subprocess.CompletedProcess[str]:
    setup = "ip link set lo up"
    if with_veth:
        setup += " && ip link add sbs-veth0 type veth peer name sbs-veth1"
    script = f'{setup} && exec "$0" -c "$1" "$2"'
    return subprocess.run(
        ["unshare", "--net", "--", "sh", "-c", script, sys.executable, _LAUNCH, str(tmp_path / "restate")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="needs root, unshare and ip to build a network namespace",
)


@needs_netns
def test_launcher_refuses_restate_server_when_a_veth_pair_exists_in_the_namespace(tmp_path: Path) -> None:
    res = _in_fresh_netns(tmp_path, with_veth=True)
    assert res.returncode == 3, (res.returncode, res.stdout, res.stderr)
    assert "refusing to start restate-server" in res.stdout
    assert "sbs-veth0" in res.stdout and "sbs-veth1" in res.stdout  # names the interfaces
    assert "outbound connection" in res.stdout  # and the reason
    assert not (tmp_path / "restate").exists()  # nothing was started


@needs_netns
def test_launcher_passes_the_guard_with_loopback_alone(tmp_path: Path) -> None:
    # The control: the same launch in a namespace with only lo gets past the guard (and then fails on the missing
    # binary), so the refusal above is the veth pair's doing.
    res = _in_fresh_netns(tmp_path, with_veth=False)
    assert res.returncode not in (0, 3), (res.returncode, res.stdout, res.stderr)
    assert "FileNotFoundError" in res.stderr and "/nonexistent/restate-server" in res.stderr


def _measured(*, with_bare: bool = True) -> sbs.Measured:
    m = sbs.Measured()
    for system, p50, step in ((sbs.DBOS, 2.0, 3.0), (sbs.RESTATE, 4.0, 1.5), (sbs.SETTLED_STEP, 11.0, 4.0)):
        m.add("turn p50, K=0 (ms)", system, p50)
        m.add("marginal cost per durable step (ms)", system, step)
        m.add("steps/s, 50 in flight, K=5", system, 400.0)
        m.add("CPU per turn at 50 in flight (ms)", system, 20.0)
    m.add("turn p50, K=0 (ms)", sbs.NO_DURABILITY, 0.001)
    m.add("marginal cost per durable step (ms)", sbs.NO_DURABILITY, 0.0001)
    if with_bare:
        m.add("turn p50, K=0 (ms)", sbs.BARE, 3.0)
    return m


_CLASSES = {c: c for c in sbs.CLASS_STRENGTH}


def test_report_pairs_classes_or_names_the_weaker_side() -> None:
    rows, failures = sbs.build_report(_measured(), _CLASSES, crash=False)
    assert failures == []
    dbos = next(r for r in rows if r["row"] == "turn p50, K=0 (ms)" and r["system"] == sbs.DBOS)
    assert dbos["class"] == sbs.PG_FSYNC
    (ratio,) = dbos["ratios"]
    assert ratio["settled"] == sbs.SETTLED_STEP and ratio["ratio"] == pytest.approx(2.0 / 11.0)
    assert ratio["note"] == "classes differ: settled ctx.step is weaker (page cache)"
    bare = next(r for r in rows if r["row"] == "turn p50, K=0 (ms)" and r["system"] == sbs.BARE)
    assert bare["ratios"][0]["note"] == ""  # same class: page cache on both sides


def test_report_fails_without_a_baseline_or_a_class() -> None:
    _rows, failures = sbs.build_report(_measured(with_bare=False), _CLASSES, crash=False)
    assert failures == ["baseline bare Kafka txn missing from row 'turn p50, K=0 (ms)'"]
    classes = {k: v for k, v in _CLASSES.items() if k != sbs.RESTATE_DEFAULT}
    _rows, failures = sbs.build_report(_measured(), classes, crash=False)
    assert failures and all("Restate" in f and "no durability class" in f for f in failures)


def test_report_fails_when_the_crash_case_or_a_counted_turn_is_missing() -> None:
    m = _measured()
    m.values[("steps/s, 50 in flight, K=5", sbs.RESTATE)] = [0.0]
    _rows, failures = sbs.build_report(m, _CLASSES, crash=True)
    assert "Restate: a throughput window counted no turn whose result the client read" in failures
    assert sum("missing from row 'crash:" in f for f in failures) == 3


def test_crash_case_must_show_steps_once_and_the_killed_step_twice(tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    counter.write_text("".join(f"step {i}\n" for i in (1, 2, 3, 3, 4, 5)))
    m = sbs.Measured()
    sbs.crash_rows(m, sbs.DBOS, t_kill=10.0, t_restart=10.1, t_done=16.0, counter=counter)
    assert m.values[("crash: kill -> done (s)", sbs.DBOS)] == [pytest.approx(6.0)]
    assert m.values[("crash: restart -> done beyond the re-run step (s)", sbs.DBOS)] == [pytest.approx(0.9)]
    # A system that ran the killed step once more (or skipped it) fails the run.
    for lines in ((1, 2, 3, 3, 3, 4, 5), (1, 2, 3, 4, 5), (1, 1, 2, 3, 3, 4, 5)):
        counter.write_text("".join(f"step {i}\n" for i in lines))
        with pytest.raises(sbs.BenchmarkError, match="executions per step"):
            sbs.crash_rows(sbs.Measured(), sbs.RESTATE, 10.0, 10.1, 16.0, counter)
