"""The fault-switch runner (scripts/fault_switches.py) against a temporary registry and temporary tests."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import tests._promise

REPO = Path(__file__).resolve().parents[3]
RUNNER = REPO / "scripts" / "fault_switches.py"

CASES = """
from settled._faults import fault_enabled
from tests._promise import promise


def test_right_id():
    promise("DUR-006", not fault_enabled("random_transactional_id"), "the zombie was not fenced")


def test_wrong_id():
    promise("DUR-001", not fault_enabled("admission_without_key_index"), "a duplicate was admitted")


def test_passes_anyway():
    assert fault_enabled("tool_before_prepared_commit")


def test_plain_assert():
    assert not fault_enabled("classifier_prepared_as_settled"), "no promise id here"


def test_hangs():
    import time

    time.sleep(120)
    promise("DUR-007", not fault_enabled("offsets_in_separate_transaction"), "too late")
"""

REGISTRY = """
[[switch]]
name = "random_transactional_id"
test = "test_cases.py::test_right_id"
promise = "DUR-006"

[[switch]]
name = "admission_without_key_index"
test = "test_cases.py::test_wrong_id"
promise = "DUR-015"

[[switch]]
name = "tool_before_prepared_commit"
test = "test_cases.py::test_passes_anyway"
promise = "DUR-009"

[[switch]]
name = "classifier_prepared_as_settled"
test = "test_cases.py::test_plain_assert"
promise = "DUR-013"
"""

HANGING = """
[[switch]]
name = "offsets_in_separate_transaction"
test = "test_cases.py::test_hangs"
promise = "DUR-007"
"""


@functools.cache
def _load_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_settled_fault_switches_script", RUNNER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, registry: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "registry.toml").write_text(textwrap.dedent(registry))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SETTLED_FAULT", None)
    command = [sys.executable, str(RUNNER), "--registry", str(tmp_path / "registry.toml"), "--root", str(tmp_path)]
    return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=240, check=False)


def _verdicts(stdout: str) -> dict[str, str]:
    table = stdout[stdout.index("switch  ") :]
    rows = [line.split("  ") for line in table.splitlines()[2:] if line.strip() and "switches caught" not in line]
    return {row[0]: next(cell.strip() for cell in row[1:] if cell.strip() in ("caught", "NOT CAUGHT")) for row in rows}


def test_caught_only_when_the_test_fails_with_the_expected_promise_id(tmp_path):
    result = _run(tmp_path, REGISTRY)

    assert result.returncode == 1, result.stdout + result.stderr
    assert _verdicts(result.stdout) == {
        "random_transactional_id": "caught",
        "admission_without_key_index": "NOT CAUGHT",
        "tool_before_prepared_commit": "NOT CAUGHT",
        "classifier_prepared_as_settled": "NOT CAUGHT",
    }
    assert "failed without [PROMISE DUR-015] (saw DUR-001)" in result.stdout
    assert "test passed" in result.stdout
    assert "failed without [PROMISE DUR-013]" in result.stdout
    assert "1/4 switches caught" in result.stdout


def test_only_runs_the_named_switch(tmp_path):
    result = _run(tmp_path, REGISTRY, "--only", "random_transactional_id")

    assert result.returncode == 0, result.stdout + result.stderr
    assert _verdicts(result.stdout) == {"random_transactional_id": "caught"}
    assert "1/1 switches caught" in result.stdout


def test_a_test_that_runs_over_its_time_limit_is_not_caught(tmp_path):
    result = _run(tmp_path, HANGING, "--timeout-s", "3")

    assert result.returncode == 1, result.stdout + result.stderr
    assert _verdicts(result.stdout) == {"offsets_in_separate_transaction": "NOT CAUGHT"}
    assert "timed out after 3 s" in result.stdout


def test_only_with_an_unregistered_switch_is_a_usage_error(tmp_path):
    result = _run(tmp_path, REGISTRY, "--only", "projection_offsets_separate_transaction")
    assert result.returncode == 2
    assert "--only 'projection_offsets_separate_transaction': no such switch" in result.stderr


def test_list_shows_entries_and_untested_switches_without_running(tmp_path):
    result = _run(tmp_path, REGISTRY, "--list")

    assert result.returncode == 0
    assert "test_cases.py::test_right_id" in result.stdout
    untested = (
        "known switches without a test yet: api_access_unchecked, approval_digest_unchecked, "
        "attempt_count_after_start, claim_without_rewind, collateral_condemned, flow_drift_unchecked, "
        "id_contract_unchecked, joined_settled_separately, lane_policy_ignored, lifecycle_outside_transaction, "
        "offsets_in_separate_transaction, projection"
    )
    assert untested in result.stdout
    assert "running" not in result.stdout


def test_empty_registry_says_so_and_passes(tmp_path):
    result = _run(tmp_path, "# nothing yet\n")
    assert result.returncode == 0
    assert "no fault switches registered yet" in result.stdout


@pytest.mark.parametrize(
    ("registry", "problem"),
    [
        ('[[switch]]\nname = "no_such"\ntest = "t.py::t"\npromise = "DUR-1"\n', "unknown switch 'no_such'"),
        ('[[switch]]\nname = "random_transactional_id"\ntest = "t.py::t"\n', "needs exactly the keys"),
        ('[[switch]]\nname = "random_transactional_id"\ntest = "t.py::t"\npromise = "DUR 1"\n', "promise 'DUR 1'"),
        ('[[switch]]\nname = "random_transactional_id"\ntest = ""\npromise = "DUR-1"\n', "test must be a non-empty"),
        ("[switch]\nname = 1\n", "array of tables"),
        ("[other]\n", "unexpected top-level keys ['other']"),
        ("[[switch]\n", "not valid TOML"),
    ],
)
def test_malformed_registry_is_rejected_with_the_problem(tmp_path, registry, problem):
    path = tmp_path / "registry.toml"
    path.write_text(registry)
    runner = _load_runner()
    with pytest.raises(runner.RegistryError, match=re.escape(problem)):
        runner.load_registry(path)


def test_duplicate_entry_is_rejected(tmp_path):
    entry = '[[switch]]\nname = "random_transactional_id"\ntest = "t.py::t"\npromise = "DUR-006"\n'
    path = tmp_path / "registry.toml"
    path.write_text(entry + entry)
    runner = _load_runner()
    with pytest.raises(runner.RegistryError, match="listed twice"):
        runner.load_registry(path)


def test_project_registry_names_known_switches_and_existing_tests():
    from settled._faults import KNOWN_FAULTS

    runner = _load_runner()
    entries = runner.load_registry(REPO / "tests" / "fault_switches.toml")
    assert entries, "the project registers its fault switches"
    for entry in entries:
        assert entry.name in KNOWN_FAULTS, entry
        path, _, test = entry.test.partition("::")
        assert (REPO / path).exists(), entry
        assert f"def {test}(" in (REPO / path).read_text(), entry
        assert f'"{entry.promise}"' in (REPO / path).read_text(), f"{entry.test} never asserts {entry.promise}"


def test_runner_and_promise_helper_agree_on_the_marker():
    assert _load_runner().PROMISE_MARKER == tests._promise.PROMISE_MARKER
