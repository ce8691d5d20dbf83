"""`ResumeGate`: after a death the resumed attempts start one at a time in the whole worker process (docs/design.md §5).

The gate is shared by the conductors of one process; each reports its suspects (Ready submissions whose attempt
recovery resumed after a death) when it schedules. Nothing new starts anywhere while a suspect waits; a suspect
starts only when nothing runs or is staged to start in the process, the lowest partition's first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from settled.processors._conductor import _ANY, ResumeGate


@dataclass
class Member:
    partition: int
    starting_or_running: bool = False
    owner: Any = field(init=False)

    def __post_init__(self) -> None:
        self.owner = type("Owner", (), {"partition": self.partition})()


def gate(*members: Member) -> ResumeGate:
    g = ResumeGate()
    for m in members:
        g.join(m)  # type: ignore[arg-type]
    return g


def admit(g: ResumeGate, m: Member, suspects: list[str]) -> str | None:
    return g.admit(m, suspects)  # type: ignore[arg-type]


def test_without_suspects_every_conductor_starts_freely() -> None:
    a, b = Member(0, starting_or_running=True), Member(1)
    g = gate(a, b)
    assert admit(g, a, []) is _ANY and admit(g, b, []) is _ANY


def test_a_suspect_waits_until_nothing_runs_in_the_process_and_nothing_else_starts_meanwhile() -> None:
    healthy, poisoned = Member(0, starting_or_running=True), Member(1)
    g = gate(healthy, poisoned)
    assert admit(g, poisoned, ["p1"]) is None, "a suspect started while another partition's attempt runs"
    assert admit(g, healthy, []) is None, "a new attempt started while a suspect waits"
    healthy.starting_or_running = False
    assert admit(g, healthy, []) is None
    assert admit(g, poisoned, ["p1"]) == "p1"
    poisoned.starting_or_running = True  # p1 runs alone now
    assert admit(g, poisoned, ["p2"]) is None and admit(g, healthy, ["h1"]) is None


def test_suspects_resume_one_at_a_time_lowest_partition_first() -> None:
    a, b, busy = Member(3), Member(1), Member(0, starting_or_running=True)
    g = gate(a, b, busy)
    assert admit(g, a, ["a1", "a2"]) is None and admit(g, b, ["b1"]) is None  # both wait for the busy one
    busy.starting_or_running = False
    assert admit(g, a, ["a1", "a2"]) is None, "partition 3's suspect went before partition 1's"
    assert admit(g, b, ["b1"]) == "b1"
    b.starting_or_running = True
    assert admit(g, a, ["a1", "a2"]) is None
    b.starting_or_running = False
    assert admit(g, b, []) is None  # b has none left; a's first goes next
    assert admit(g, a, ["a1", "a2"]) == "a1"


def test_a_conductor_that_leaves_takes_its_suspects_and_runs_with_it() -> None:
    a, b = Member(0, starting_or_running=True), Member(1)
    g = gate(a, b)
    assert admit(g, a, ["a1"]) is None
    g.leave(a)  # type: ignore[arg-type]
    assert admit(g, b, []) is _ANY
