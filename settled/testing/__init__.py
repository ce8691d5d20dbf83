"""settled.testing: the one harness for tests, benchmarks and the BFCL example (issue 14 item 2).

* `WorkerProcess`: a ``settled worker`` child process (spawn, signals, stop, kill at a failpoint, stacks on
  demand, its JSON-lines log) — the only place that starts ``settled worker``.
* `Supervisor`: keeps one worker position running, restarting a worker that exits (README, "Operating").
* `FailpointControl`: the failpoint controller (arm and disarm live processes, barriers, the hit log;
  ``settled/_failpoints.py``).
* `ApiProcess`: a ``settled api`` child (issue 20), answering HTTP once started.
* ``settled.testing.echo:app``: the echo app (``EchoAgent``): replies with its input, misbehaves on crafted input.
"""

from settled._failpoints import FailpointControl, ScheduledKill, choose_schedule
from settled.testing._api import ApiProcess, free_port
from settled.testing._process import KILLED_EXIT_CODE, WorkerProcess
from settled.testing._supervisor import Supervisor
from settled.testing.echo import ECHO_APP, EchoAgent

__all__ = [
    "ECHO_APP",
    "KILLED_EXIT_CODE",
    "ApiProcess",
    "EchoAgent",
    "FailpointControl",
    "ScheduledKill",
    "Supervisor",
    "WorkerProcess",
    "choose_schedule",
    "free_port",
]
