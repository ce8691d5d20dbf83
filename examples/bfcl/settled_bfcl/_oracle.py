"""The oracle: an independent in-memory execution of an entry's ground truth, and BFCL's state check (issue 8, item 5).

:func:`run_oracle` executes every ground-truth call of an entry, in order, against a fresh :class:`World` built
from the entry's ``initial_config``; it records each call's output (BFCL's error-to-output convention) and the
final world. Run it in a fresh interpreter when judging a live run (research doc §4): a process that has hosted
other worlds may carry module-level state (mpmath precision, BFCL's long-context extension globals).

:func:`check_final_state` is the verdict on end state: BFCL's own ``state_checker`` (from
``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker``), which compares every public attribute of each
instance with ``!=``; private attributes (``_random``, ``_current_dir``, ...) are not compared.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker

from settled_bfcl._backends import World
from settled_bfcl._corpus import Entry, GroundTruthCall
from settled_bfcl._errors import BfclError

__all__ = ["OracleCall", "OracleRun", "StateVerdict", "check_final_state", "run_oracle"]


@dataclass(frozen=True, slots=True)
class OracleCall:
    """One executed ground-truth call.

    Attributes:
        call: The ground-truth call.
        output: Its output string (BFCL's convention; an exception is ``"Error during execution: <msg>"``).
    """

    call: GroundTruthCall
    output: str


@dataclass(frozen=True, slots=True)
class OracleRun:
    """The oracle's execution of one entry.

    Attributes:
        entry_id: The entry.
        calls: Every ground-truth call with its output, in execution order.
        world: The final world.
    """

    entry_id: str
    calls: tuple[OracleCall, ...]
    world: World

    @property
    def outputs(self) -> dict[str, str]:
        """Call id to output (a new dict on each access)."""
        return {c.call.call_id: c.output for c in self.calls}

    def turn_outputs(self, turn_index: int) -> tuple[str, ...]:
        """Return the outputs of one turn's calls, in order.

        Args:
            turn_index: Zero-based turn index.

        Returns:
            The outputs.
        """
        return tuple(c.output for c in self.calls if c.call.turn_index == turn_index)


def run_oracle(entry: Entry, skip: Collection[str] = frozenset()) -> OracleRun:
    """Execute an entry's ground truth on a fresh world.

    Every call runs, offered in its turn or not (:attr:`GroundTruthCall.offered`), as BFCL's checker does, except
    the calls named in ``skip``: the reference run of a conversation whose operator denied them
    (`settled_bfcl._approvals`).

    Args:
        entry: The entry.
        skip: Call ids that never run (denied); they are left out of the result.

    Returns:
        Each call's output and the final world.
    """
    world = entry.world()
    calls = tuple(
        OracleCall(call, world.execute(call.method, call.arguments)) for call in entry.calls if call.call_id not in skip
    )
    return OracleRun(entry_id=entry.id, calls=calls, world=world)


@dataclass(frozen=True, slots=True)
class StateVerdict:
    """The result of BFCL's state check on two worlds.

    Attributes:
        valid: True when every class's public state matches.
        class_name: The first class whose state differs (None when valid).
        differences: Attribute name to ``{"model": candidate value, "ground_truth": oracle value}`` for that class.
        message: BFCL's error message (empty when valid).
    """

    valid: bool
    class_name: str | None = None
    differences: Mapping[str, Any] = field(default_factory=dict)
    message: str = ""


def check_final_state(candidate: World, oracle: World) -> StateVerdict:
    """Compare a candidate run's final world with the oracle's, using BFCL's own ``state_checker``.

    Args:
        candidate: The world a live run left (e.g. loaded from the tool server's store).
        oracle: :attr:`OracleRun.world` of the same entry.

    Returns:
        The verdict.

    Raises:
        BfclError: The two worlds do not hold the same classes (BFCL would assert).
    """
    if set(candidate.class_names) != set(oracle.class_names):
        raise BfclError(
            f"cannot compare worlds of different classes: candidate {sorted(candidate.class_names)}, "
            f"oracle {sorted(oracle.class_names)}"
        )
    for name in oracle.class_names:
        if type(candidate.instances[name]) is not type(oracle.instances[name]):
            raise BfclError(f"{name}: candidate instance is a {type(candidate.instances[name]).__name__}")
    result: dict[str, Any] = state_checker(dict(candidate.instances), dict(oracle.instances))
    if result["valid"]:
        return StateVerdict(valid=True)
    message = str(result.get("error_message", ""))
    failing = next((name for name in oracle.class_names if f"for {name} " in message), None)
    details = result.get("details", {})
    return StateVerdict(
        valid=False, class_name=failing, differences=dict(details.get("differences", {})), message=message
    )
