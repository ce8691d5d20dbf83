"""One error root with a category on each class; the CLI's exit codes are a lookup (issue 14 item 4).

Every exception class settled defines (outside the BFCL example) derives from `settled.SettledError` and carries an
`ErrorCategory`; `EXIT_CODES` maps categories to the exit codes README "Operating" documents.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import settled
from settled import EXIT_CODES, ErrorCategory, SettledError, exit_code

#: Exception classes that are not errors, with the reason.
NOT_ERRORS = {
    "settled.runtime._errors.RunSuspended": "a BaseException that ends a run waiting for an operator (control flow)",
}


def _modules() -> list[str]:
    names = ["settled"]
    for info in pkgutil.walk_packages(settled.__path__, "settled."):
        if ".bfcl" in info.name or info.name.endswith("__main__"):  # BFCL leaves the package (issue 14 item 1)
            continue
        names.append(info.name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not attr.startswith("_")
            ):
                found[f"{name}.{attr}"] = value
    return found


def test_the_exit_code_table_is_the_documented_one() -> None:
    assert dict(EXIT_CODES) == {
        ErrorCategory.REJECTED: 1,
        ErrorCategory.NOT_FOUND: 1,
        ErrorCategory.BROKEN_INVARIANT: 1,
        ErrorCategory.BAD_INPUT: 2,
        ErrorCategory.UNAVAILABLE: 2,
        ErrorCategory.OUTCOME_UNKNOWN: 3,
        ErrorCategory.CONFLICT: 3,
        ErrorCategory.PENDING: 4,
    }
    assert set(EXIT_CODES) == set(ErrorCategory)


def test_every_error_class_derives_from_the_root_and_has_a_category() -> None:
    classes = _exception_classes()
    assert len(classes) > 40, sorted(classes)  # the walk found the package's errors
    missing = sorted(
        name
        for name, cls in classes.items()
        if cls is not SettledError
        and name not in NOT_ERRORS
        and not (issubclass(cls, SettledError) and isinstance(getattr(cls, "category", None), ErrorCategory))
    )
    assert missing == [], f"errors without the root or a category: {missing}"


@pytest.mark.parametrize(
    ("qualified", "code"),
    [
        ("settled.client.SubmissionRejectedError", 1),
        ("settled.client.OutcomeUnknownError", 3),
        ("settled.client.BrokerUnavailableError", 2),
        ("settled.client.PayloadTooLargeError", 2),
        ("settled.client.SettlementTimeoutError", 4),
        ("settled.projections.RebuildInProgressError", 3),
        ("settled.runtime.AppLoadError", 2),
    ],
)
def test_the_cli_codes_readme_documents_come_from_the_categories(qualified: str, code: int) -> None:
    module, _, name = qualified.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    error = cls.__new__(cls)  # the code depends on the class alone
    assert exit_code(error) == code


def test_one_class_per_invariant() -> None:
    from settled.processors import PartitionOwner  # noqa: F401 - the owner raises the protocol's StaleEpochError
    from settled.protocol import StaleEpochError
    from settled.schemas import ChainBreakError

    classes = _exception_classes()
    assert [n for n, c in classes.items() if c.__name__.startswith("StaleEpoch")] == [
        "settled.protocol._errors.StaleEpochError"
    ]
    assert [n for n, c in classes.items() if c.__name__.startswith("Chain")] == [
        "settled.schemas._envelope.ChainBreakError"
    ]
    assert StaleEpochError.category is ErrorCategory.CONFLICT
    assert ChainBreakError.category is ErrorCategory.BROKEN_INVARIANT
