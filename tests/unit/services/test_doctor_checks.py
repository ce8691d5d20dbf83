"""``settled doctor``'s checks that need no broker (issue 21 item 3): the resolver key and the check selection."""

from __future__ import annotations

import pytest

from settled._settings import Settings
from settled.runtime import App, RunContext
from settled.services._doctor import CHECK_NAMES, CheckStatus, DoctorOptions, check_resolver_key, run_checks

#: A syntactically valid Ed25519 public key (32 zero bytes, base64); the check reads key ids, not keys.
_KEY = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


async def _agent(ctx: RunContext) -> str:
    return "ok"


def _app(*, resolver_keys: dict[str, str], idempotent: bool) -> App:
    app = App(agent=_agent, resolver_keys=resolver_keys)

    @app.tool(idempotent=idempotent)
    async def refund(amount_cents: int) -> str:
        return f"refunded {amount_cents}"

    return app


def test_unsafe_tools_without_a_resolver_key_fail_naming_the_tool() -> None:
    result = check_resolver_key(Settings(), DoctorOptions(app=_app(resolver_keys={}, idempotent=False)))
    assert result.status is CheckStatus.FAILED
    assert "refund" in result.detail


def test_unsafe_tools_with_a_resolver_key_pass() -> None:
    result = check_resolver_key(Settings(), DoctorOptions(app=_app(resolver_keys={"ops-1": _KEY}, idempotent=False)))
    assert result.status is CheckStatus.OK
    assert "ops-1" in result.detail


def test_idempotent_tools_need_no_resolver_key() -> None:
    result = check_resolver_key(Settings(), DoctorOptions(app=_app(resolver_keys={}, idempotent=True)))
    assert result.status is CheckStatus.OK


def test_without_an_app_the_resolver_key_check_is_skipped() -> None:
    assert check_resolver_key(Settings(), DoctorOptions()).status is CheckStatus.SKIPPED


def test_an_unknown_check_name_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'clock'"):
        run_checks(Settings(), DoctorOptions(), ["clock"])


def test_only_runs_the_named_checks() -> None:
    results = run_checks(Settings(), DoctorOptions(app=_app(resolver_keys={}, idempotent=True)), ["resolver-key"])
    assert [r.name for r in results] == ["resolver-key"]
    assert set(CHECK_NAMES) >= {r.name for r in results}
