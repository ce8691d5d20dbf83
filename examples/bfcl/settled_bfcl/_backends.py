"""BFCL's eight multi-turn backends as one in-memory world, executed without ``eval`` (issue 8, research §2).

A :class:`World` holds one instance per involved backend class, built the way BFCL builds them
(``Class()`` then ``_load_scenario(deepcopy(config), long_context=...)``, except for the stateless ``MathAPI``), and
then deep-copied once more, because the long-context extension dicts are module globals shared by reference
(research §4, pitfalls). A call is a method name plus JSON arguments; it runs as ``getattr(instance, name)(**args)``
and its result becomes a string with BFCL's own convention (:func:`bfcl_output`), an exception included.

Two departures from BFCL's ``execute_multi_turn_func_call``, both to make a call's effect a function of the world
and the call alone (so a tool server that restarts, or hosts many conversations, behaves like a fresh process):

* the arguments are deep-copied before the call, so a backend that keeps a reference never aliases the caller's;
* a parameter whose default is a mutable container (``TwitterAPI.post_tweet(tags=[], mentions=[])``) and that the
  call leaves out gets a fresh copy of the default. BFCL shares the one default list across every call in the
  process, and ``mention()`` extends it; the research doc shows a fresh instance then posting ``mentions=['@bob']``.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.metadata
import inspect
import json
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from settled_bfcl._errors import BfclError, BfclVersionError, UnknownMethodError

__all__ = [
    "BACKEND_CLASSES",
    "BFCL_EVAL_VERSION",
    "JsonValue",
    "MethodSpec",
    "World",
    "bfcl_output",
    "check_bfcl_version",
    "method_index",
    "method_spec",
]

#: The ``bfcl-eval`` release this package was written and measured against (research doc, §1).
BFCL_EVAL_VERSION = "2026.3.23"

#: The eight multi-turn backend classes and their modules (``bfcl_eval.constants.executable_backend_config``).
BACKEND_CLASSES: Mapping[str, str] = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
_BACKEND_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# BFCL skips ``_load_scenario`` for these (``STATELESS_CLASSES`` in executable_backend_config).
_STATELESS_CLASSES = frozenset({"MathAPI"})
_ERROR_PREFIX = "Error during execution: "

#: A JSON value as Python holds it: an int stays an int and a float stays a float.
JsonValue: TypeAlias = str | int | float | bool | list["JsonValue"] | dict[str, "JsonValue"] | None


def check_bfcl_version() -> str:
    """Check that the pinned ``bfcl-eval`` is installed.

    Returns:
        The installed version.

    Raises:
        BfclVersionError: ``bfcl-eval`` is missing or another version is installed.
    """
    install = f"pip install --no-deps bfcl-eval=={BFCL_EVAL_VERSION} mpmath==1.3.0"
    try:
        version = importlib.metadata.version("bfcl-eval")
    except importlib.metadata.PackageNotFoundError as exc:
        raise BfclVersionError(f"bfcl-eval is not installed; install it with: {install}") from exc
    if version != BFCL_EVAL_VERSION:
        raise BfclVersionError(
            f"bfcl-eval {version} is installed but settled pins {BFCL_EVAL_VERSION} (corpus counts and backend "
            f"behaviour were measured on it); install it with: {install}"
        )
    return version


def _backend_class(class_name: str) -> type[Any]:
    try:
        module_name = BACKEND_CLASSES[class_name]
    except KeyError:
        raise UnknownMethodError(
            f"unknown BFCL backend class {class_name!r}; known: {', '.join(sorted(BACKEND_CLASSES))}"
        ) from None
    module = importlib.import_module(f"{_BACKEND_PACKAGE}.{module_name}")
    cls: type[Any] = getattr(module, class_name)
    return cls


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """One public backend method, as BFCL exposes it to a model.

    Attributes:
        name: The method name; unique across the eight classes.
        class_name: The backend class defining it.
        parameters: The parameter names in signature order, without ``self``.
        signature: The method's signature as bound to an instance (no ``self``).
    """

    name: str
    class_name: str
    parameters: tuple[str, ...]
    signature: inspect.Signature


@functools.cache
def method_index() -> Mapping[str, MethodSpec]:
    """Index every public method of the eight backends by name.

    BFCL maps a bare method name to its instance, so a name must not occur in two classes; this is checked.

    Returns:
        Method name to its :class:`MethodSpec` (128 methods for bfcl-eval 2026.3.23).

    Raises:
        BfclError: Two backend classes define a public method of the same name.
    """
    index: dict[str, MethodSpec] = {}
    for class_name in BACKEND_CLASSES:
        cls = _backend_class(class_name)
        for name, function in inspect.getmembers(cls, predicate=inspect.isfunction):
            if name.startswith("_"):
                continue
            if name in index:
                raise BfclError(f"method {name!r} is defined by both {index[name].class_name} and {class_name}")
            full = inspect.signature(function)
            bound = full.replace(parameters=list(full.parameters.values())[1:])
            index[name] = MethodSpec(name, class_name, tuple(bound.parameters), bound)
    return index


def method_spec(name: str) -> MethodSpec:
    """Return the spec of one backend method.

    Args:
        name: A bare method name, e.g. ``"mkdir"``.

    Returns:
        Its :class:`MethodSpec`.

    Raises:
        UnknownMethodError: No backend defines a public method of that name.
    """
    spec = method_index().get(name)
    if spec is None:
        raise UnknownMethodError(f"{name!r} is not a public method of any BFCL multi-turn backend")
    return spec


def bfcl_output(value: object) -> str:
    """Turn a backend method's return value into the string a model sees, exactly as BFCL does.

    ``execute_multi_turn_func_call``: a ``str`` is kept; a ``dict`` goes through ``json.dumps`` and, when that
    fails (``logarithm`` returns an mpmath ``mpf``), through ``str``; anything else through ``str`` (so a list uses
    Python's repr and ``None`` becomes ``"None"``).

    Args:
        value: The return value.

    Returns:
        The output string.
    """
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def _fresh_mutable_defaults(spec: MethodSpec, arguments: dict[str, Any]) -> None:
    for name, parameter in spec.signature.parameters.items():
        if name not in arguments and isinstance(parameter.default, list | dict | set):
            arguments[name] = copy.deepcopy(parameter.default)


class World:
    """The backend instances of one conversation; every call mutates them in place.

    Build one with :meth:`from_config`. A world pickles (:meth:`dumps` / :meth:`loads`): the research doc checked
    that a pickle round trip between turns changes neither outputs nor state on 400/400 entries.
    """

    def __init__(self, instances: Mapping[str, Any]) -> None:
        """Wrap already-built backend instances.

        Args:
            instances: Backend class name to its instance.
        """
        self._instances: dict[str, Any] = dict(instances)

    @classmethod
    def from_config(
        cls, initial_config: Mapping[str, Any], involved_classes: Iterable[str], *, long_context: bool = False
    ) -> World:
        """Build fresh backend instances from an entry's ``initial_config``, as BFCL does, on deep copies.

        Args:
            initial_config: Class name to its scenario dict; a class left out gets its ``DEFAULT_STATE``.
            involved_classes: The classes to instantiate.
            long_context: Pass BFCL's long-context flag to ``_load_scenario`` (categories ``long_context``).

        Returns:
            The new world.

        Raises:
            UnknownMethodError: A class name is not one of the eight backends.
        """
        instances: dict[str, Any] = {}
        for class_name in involved_classes:
            instance = _backend_class(class_name)()
            if class_name not in _STATELESS_CLASSES:
                scenario = copy.deepcopy(dict(initial_config.get(class_name, {})))
                instance._load_scenario(scenario, long_context=long_context)
            # The long-context extensions are module globals loaded by reference: cut every shared reference.
            instances[class_name] = copy.deepcopy(instance)
        return cls(instances)

    @property
    def instances(self) -> Mapping[str, Any]:
        """Backend class name to its live instance (BFCL's ``state_checker`` compares these)."""
        return self._instances

    @property
    def class_names(self) -> tuple[str, ...]:
        """The involved backend classes, in the order they were built."""
        return tuple(self._instances)

    def offers(self, method: str) -> bool:
        """Tell whether a method belongs to one of this world's classes.

        Args:
            method: A bare method name.

        Returns:
            True when the method exists in an involved class.
        """
        spec = method_index().get(method)
        return spec is not None and spec.class_name in self._instances

    def class_of(self, method: str) -> str:
        """Return the involved class that defines a method.

        Args:
            method: A bare method name.

        Returns:
            The class name.

        Raises:
            UnknownMethodError: No involved class defines it.
        """
        spec = method_spec(method)
        if spec.class_name not in self._instances:
            raise UnknownMethodError(
                f"{method!r} belongs to {spec.class_name}, which is not involved in this world "
                f"({', '.join(self._instances)})"
            )
        return spec.class_name

    def execute(self, method: str, arguments: Mapping[str, JsonValue]) -> str:
        """Run one call and return its output with BFCL's convention.

        An exception raised by the backend (bad arguments included) becomes ``"Error during execution: <msg>"``,
        as in BFCL: that is the tool's answer, not a failure of the call.

        Args:
            method: A bare method name.
            arguments: Named arguments (JSON values); deep-copied before the call.

        Returns:
            The output string.

        Raises:
            UnknownMethodError: No involved class defines the method (nothing runs).
        """
        class_name = self.class_of(method)
        spec = method_spec(method)
        kwargs: dict[str, Any] = copy.deepcopy(dict(arguments))
        _fresh_mutable_defaults(spec, kwargs)
        bound = getattr(self._instances[class_name], method)
        try:
            result = bound(**kwargs)
        except Exception as exc:  # noqa: BLE001 - BFCL's convention: the exception text is the tool's output.
            return f"{_ERROR_PREFIX}{exc}"
        return bfcl_output(result)

    def copy(self) -> World:
        """Return an independent deep copy (RNG state included).

        Returns:
            The copy.
        """
        return World(copy.deepcopy(self._instances))

    def dumps(self) -> bytes:
        """Serialize the world (pickle; the stored bytes are only ever read back by settled itself).

        Returns:
            The pickled instances.
        """
        return pickle.dumps(self._instances, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def loads(cls, data: bytes) -> World:
        """Rebuild a world from :meth:`dumps` output.

        Args:
            data: Bytes written by :meth:`dumps` (trusted: our own store).

        Returns:
            The world.

        Raises:
            BfclError: The bytes do not hold a world.
        """
        instances = pickle.loads(data)  # our own store's bytes, never input from a client
        if not isinstance(instances, dict) or not all(isinstance(k, str) for k in instances):
            raise BfclError(f"stored world is a {type(instances).__name__}, not a dict of backend instances")
        return cls(instances)
