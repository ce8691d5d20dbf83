"""Production Kafka timeouts by default; the dev stack's short ones for tests, benchmarks, the demo (issue 14 item 5).

The suite itself must run with the short ones (`tests/conftest.py` puts them in the environment): a test that
silently ran with 45 s sessions would wait 45 s for every takeover.
"""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from settled._settings import DEV_TIMEOUTS, Settings
from settled.processors import default_turn_watchdog_s

TIMEOUT_ENV = ("SETTLED_SESSION_TIMEOUT_MS", "SETTLED_HEARTBEAT_INTERVAL_MS", "SETTLED_TRANSACTION_TIMEOUT_MS")


@pytest.fixture
def production_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TIMEOUT_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("production_env")
def test_the_defaults_are_kafkas_own_and_fit_a_loaded_machine() -> None:
    s = Settings()
    assert (s.session_timeout_ms, s.heartbeat_interval_ms, s.transaction_timeout_ms) == (45_000, 3_000, 30_000)
    assert s.transaction_timeout_ms < s.session_timeout_ms
    assert default_turn_watchdog_s(s) == 100.0  # 7 calls x 10 s + 30 s: the README's figure
    assert s.timeouts_label() == "production (session 45000 ms, heartbeat 3000 ms, transaction 30000 ms)"


def test_the_suite_runs_with_the_dev_stacks_short_timeouts() -> None:
    s = Settings()
    assert {name: getattr(s, name) for name in DEV_TIMEOUTS} == {
        "session_timeout_ms": 3000,
        "heartbeat_interval_ms": 500,
        "transaction_timeout_ms": 2500,
    }
    assert {k: os.environ[k] for k in TIMEOUT_ENV} == s.timeouts_env()  # what every spawned worker inherits
    assert default_turn_watchdog_s(s) == 72.5
    assert s.timeouts_label().startswith("dev ")


@pytest.mark.usefixtures("production_env")
def test_with_dev_timeouts_fills_only_what_is_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().with_dev_timeouts().timeouts_env() == {
        "SETTLED_SESSION_TIMEOUT_MS": "3000",
        "SETTLED_HEARTBEAT_INTERVAL_MS": "500",
        "SETTLED_TRANSACTION_TIMEOUT_MS": "2500",
    }
    monkeypatch.setenv("SETTLED_SESSION_TIMEOUT_MS", "10000")
    monkeypatch.setenv("SETTLED_TRANSACTION_TIMEOUT_MS", "8000")
    s = Settings().with_dev_timeouts()
    assert (s.session_timeout_ms, s.heartbeat_interval_ms, s.transaction_timeout_ms) == (10_000, 500, 8_000)
    assert s.timeouts_label().startswith("custom ")


@pytest.mark.usefixtures("production_env")
def test_a_transaction_timeout_not_below_the_session_timeout_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"transaction_timeout_ms \(45000\) must be below session_timeout_ms"):
        Settings(transaction_timeout_ms=45_000)
    with pytest.raises(ValidationError, match=r"heartbeat_interval_ms \(3000\) must be below session_timeout_ms"):
        Settings(session_timeout_ms=3000, heartbeat_interval_ms=3000, transaction_timeout_ms=2500)
