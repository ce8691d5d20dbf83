"""The ``settled`` distribution holds the product only: no BFCL module or dependency (issue 14 item 1).

A fast check of what ``pip wheel`` would package, against setuptools' own package discovery run with the
``[tool.setuptools.packages.find]`` settings of ``pyproject.toml``, and of the declared dependencies. The BFCL main job
is the ``settled-bfcl`` distribution in ``examples/bfcl``.
"""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BFCL_DEPENDENCIES = {"bfcl-eval", "mpmath", "fastapi", "uvicorn", "httpx"}
#: The HTTP API's web stack (issue 20) is declared by its own extra only, never by the core or another extra.
HTTP_EXTRA = "http"
HTTP_DEPENDENCIES = {"fastapi", "uvicorn", "httpx", "jinja2"}


def _packaged() -> list[str]:
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    return find_packages(where=str(ROOT), include=find.get("include", ["*"]), exclude=find.get("exclude", []))


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def test_the_wheel_packages_no_bfcl_module_and_does_package_the_harness() -> None:
    packaged = _packaged()
    assert "settled" in packaged and "settled.testing" in packaged, packaged
    assert [p for p in packaged if "bfcl" in p] == [], packaged
    assert not (ROOT / "settled" / "services" / "bfcl").exists()


def test_the_wheel_declares_no_bfcl_dependency_or_extra() -> None:
    project = PYPROJECT["project"]
    extras = project.get("optional-dependencies", {})
    assert "bfcl" not in extras, sorted(extras)
    declared = {_name(r) for r in project["dependencies"]} | {
        _name(r) for name, rs in extras.items() if name != HTTP_EXTRA for r in rs
    }
    assert declared & BFCL_DEPENDENCIES == set(), sorted(declared & BFCL_DEPENDENCIES)
    assert {_name(r) for r in extras[HTTP_EXTRA]} == HTTP_DEPENDENCIES, extras[HTTP_EXTRA]
    data = PYPROJECT["tool"]["setuptools"].get("package-data", {})
    assert [g for globs in data.values() for g in globs if "bfcl" in g] == [], data


def test_the_example_is_its_own_distribution_providing_the_demo_entry_point() -> None:
    example = tomllib.loads((ROOT / "examples" / "bfcl" / "pyproject.toml").read_text())["project"]
    assert example["name"] == "settled-bfcl"
    assert "settled" in {_name(r) for r in example["dependencies"]}
    assert example["entry-points"]["settled.demo"] == {"bfcl": "settled_bfcl._cli:main"}


def test_the_wheel_ships_the_operator_pages_templates() -> None:
    """Every template of the operator's page (``/ui``, issue 21 item 1) matches a ``package-data`` glob."""
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["settled"]
    templates = sorted((ROOT / "settled" / "api" / "templates").iterdir())
    assert templates, "settled/api/templates is empty"
    unshipped = [t.name for t in templates if not any(fnmatch(str(t.relative_to(ROOT / "settled")), g) for g in globs)]
    assert unshipped == [], (unshipped, globs)
