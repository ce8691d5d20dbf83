"""One error root with a category on each class; the CLI's exit codes are a lookup (issue 14 item 4).

Every exception class settled defines (outside the BFCL example) derives from `settled.SettledError` and carries an
`ErrorCategory`; `EXIT_CODES` maps categories to the exit codes README "Operating" documents. Every error class of
settled and of the BFCL example has one name, ending in ``Error``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import settled
import settled_bfcl
from settled import EXIT_CODES, ErrorCategory, SettledError, exit_code

#: Exception classes that are not errors, with the reason.
NOT_ERRORS = {
    "settled.runtime._errors.RunSuspended": "a BaseException that ends a run waiting for an operator (control flow)",
}

#: Exception classes whose name does not end in ``Error``, with the reason: none of them is an error.
NOT_NAMED_ERROR = {
    **NOT_ERRORS,
    "settled.projections._rebuild._Behind": "a private signal inside rebuild's switch: roll back and try again",
    "settled.projections._rebuild._GapTooLarge": "a private signal inside rebuild's switch: catch up outside the lock",
    "settled.processors._worker._FenceSeen": "a private signal out of the worker's loop: `run` judges the fence",
}


def _modules(package: str = "settled") -> list[str]:
    names = [package]
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if ".bfcl" in info.name or info.name.endswith("__main__"):  # BFCL leaves the package (issue 14 item 1)
            continue
        names.append(info.name)
    return names


def _exception_classes(package: str = "settled", *, private: bool = False) -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules(package):
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and (private or not attr.startswith("_"))
            ):
                found[f"{name}.{value.__qualname__}"] = value
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


@pytest.mark.parametrize("package", [settled.__name__, settled_bfcl.__name__])
def test_every_error_class_name_ends_in_error(package: str) -> None:
    classes = _exception_classes(package, private=True)
    assert len(classes) > 10, sorted(classes)  # the walk found the package's errors
    misnamed = sorted(
        name for name, cls in classes.items() if not cls.__name__.endswith("Error") and name not in NOT_NAMED_ERROR
    )
    assert misnamed == [], f"error classes whose name does not end in Error: {misnamed}"
    listed = {name for name in NOT_NAMED_ERROR if name.startswith(f"{package}.")}
    assert listed <= set(classes), f"stale entries in NOT_NAMED_ERROR: {sorted(listed - set(classes))}"
