"""A child process for the failpoint tests: records each pass, then hits one failpoint.

Usage: ``python _fp_child.py RECORD_FILE NAME PASSES [PAUSE_S]``. Pass ``i`` appends ``"i\\n"`` to RECORD_FILE (an
unbuffered write, so it survives a SIGKILL right after) and then calls ``failpoint(NAME)``; between passes it
sleeps PAUSE_S (default 0). It prints ``done`` and exits 0 after the last pass.
"""

from __future__ import annotations

import os
import sys
import time

from settled._failpoints import failpoint


def main() -> None:
    record, name, passes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pause_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for i in range(1, passes + 1):
        os.write(fd, f"{i}\n".encode())
        failpoint(name)
        time.sleep(pause_s)
    print("done", flush=True)


if __name__ == "__main__":
    main()
