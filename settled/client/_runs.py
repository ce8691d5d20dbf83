"""What `Client.incomplete_runs` returns (issue 17 item 4): a workflow run not settled yet, as the projection shows it.

The rows come from the projection's ``workflow_runs`` view (``settled/projections/sql/0008_workflow_runs.sql``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["IncompleteRun"]


@dataclass(frozen=True)
class IncompleteRun:
    """A workflow run not settled yet: which, where it is, what it waits for.

    Attributes:
        run_id: The run (its submission id; ``pause_run`` / ``resume_run`` take it).
        conversation_id: Its conversation.
        workflow: The workflow's name.
        task_id: The run's task id.
        status: ``queued``, ``running``, ``waiting``, ``recovery``, ``terminalizing``.
        current_step: The step it is at, 1-based, or None before its plan is projected.
        total_steps: The workflow's number of steps, or None before its plan is projected.
        step_name: The name of the step it is at, or None.
        waits_for: ``pause``, ``approval``, ``retry``, ``signal``, ``unknown`` (a call in doubt) or
            ``next_attempt``; None while it runs or is queued.
        waiting_name: The names of what it waits for (the approval's step, the signal, the tool in doubt), or None.
        waiting_since: When it began to wait, or None.
        waiting_deadline: The earliest deadline of its waits, or None.
        attempt_count: Attempts started so far.
        admitted_at: When the run was admitted.
    """

    run_id: str
    conversation_id: str
    workflow: str
    task_id: str
    status: str
    current_step: int | None
    total_steps: int | None
    step_name: str | None
    waits_for: str | None
    waiting_name: str | None
    waiting_since: datetime | None
    waiting_deadline: datetime | None
    attempt_count: int
    admitted_at: datetime | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> IncompleteRun:
        """Build one from a ``workflow_runs`` view row.

        Args:
            row: The row (column name to value).

        Returns:
            The run.
        """
        return cls(
            run_id=row["submission_id"],
            conversation_id=row["conversation_id"],
            workflow=row["workflow"],
            task_id=row["task_id"],
            status=row["status"],
            current_step=row["step_number"],
            total_steps=row["total_steps"],
            step_name=row["step_name"],
            waits_for=row["waits_for"],
            waiting_name=row["waiting_name"],
            waiting_since=row["waiting_since"],
            waiting_deadline=row["waiting_deadline"],
            attempt_count=row["attempt_count"],
            admitted_at=row["admitted_at"],
        )
