"""Fault switches (settled._faults) and promise assertions (tests/_promise.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from settled._faults import KNOWN_FAULTS, UnknownFaultError, enabled_faults, fault_enabled, reload_faults
from tests._promise import promise, promise_marker

EXPECTED_SWITCHES = {
    "random_transactional_id",
    "offsets_in_separate_transaction",
    "tool_before_prepared_commit",
    "step_not_awaited",
    "classifier_prepared_as_settled",
    "admission_without_key_index",
    "projection_offsets_separate_transaction",
    "id_contract_unchecked",
    "projection_data_error_retried",
    "claim_without_rewind",
    "signal_honoured_before_canonical",
    "sdk_retries_on",
    "approval_digest_unchecked",
    "tool_runs_before_approval",
    "api_access_unchecked",
    "workflow_retry_unrecorded",
    "flow_drift_unchecked",
    "workflow_denial_replayed",
    "collateral_condemned",
    "ui_csrf_unchecked",
    "lifecycle_outside_transaction",
    "attempt_count_after_start",
    "lane_policy_ignored",
    "joined_settled_separately",
}


def test_registry_holds_the_promised_switches():
    assert set(KNOWN_FAULTS) == EXPECTED_SWITCHES
    assert all("DUR-" in description for description in KNOWN_FAULTS.values())


def test_unset_means_every_switch_off():
    assert enabled_faults() == frozenset()
    assert not any(fault_enabled(name) for name in KNOWN_FAULTS)


def test_listed_switches_are_on(monkeypatch):
    monkeypatch.setenv("SETTLED_FAULT", " random_transactional_id ,, admission_without_key_index")
    assert fault_enabled("random_transactional_id")
    assert fault_enabled("admission_without_key_index")
    assert not fault_enabled("tool_before_prepared_commit")


def test_environment_is_read_once_until_reload(monkeypatch):
    assert not fault_enabled("random_transactional_id")
    monkeypatch.setenv("SETTLED_FAULT", "random_transactional_id")
    assert not fault_enabled("random_transactional_id")  # read at first use, not per call
    assert reload_faults() == {"random_transactional_id"}
    assert fault_enabled("random_transactional_id")


def test_unknown_name_in_environment_is_named(monkeypatch):
    monkeypatch.setenv("SETTLED_FAULT", "random_transactional_id,randm_transactional_id")
    expected = "unknown fault switch 'randm_transactional_id' in SETTLED_FAULT"
    with pytest.raises(UnknownFaultError, match=expected) as info:
        fault_enabled("random_transactional_id")
    assert info.value.name == "randm_transactional_id"


def test_unknown_name_in_code_is_named():
    with pytest.raises(UnknownFaultError, match="'no_such_switch' in a fault_enabled"):
        fault_enabled("no_such_switch")


def test_import_reads_nothing():
    env = {**os.environ, "SETTLED_FAULT": "not_a_switch"}
    code = "import settled._faults as f; print(f._enabled)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "None"


def test_promise_holds_silently():
    promise("DUR-006", True, "not shown")


def test_broken_promise_names_its_id():
    with pytest.raises(AssertionError) as info:
        promise("DUR-006", False, "the zombie's write became visible")
    assert str(info.value) == "[PROMISE DUR-006] the zombie's write became visible"
    assert promise_marker("DUR-006.zombie") == "[PROMISE DUR-006.zombie]"


@pytest.mark.parametrize("bad_id", ["", " DUR-006", "DUR 006", "DUR-006]", "-x"])
def test_malformed_assertion_id_is_rejected_even_when_the_promise_holds(bad_id):
    with pytest.raises(ValueError, match="assertion_id"):
        promise(bad_id, True, "x")
