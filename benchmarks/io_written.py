"""Run a command and record the bytes its whole process tree wrote to storage.

    python -m benchmarks.io_written <out.json> -- <command> [args...]

Linux adds the I/O counters of a child it reaps to its parent's (as it does CPU time), so once
the command has exited and been waited for, this process's ``/proc/self/io`` counts every byte
the command and the descendants it waited for sent to storage (``write_bytes``; writes to files
deleted before they reached the disk, spills for example, are ``cancelled_write_bytes``). The
command's exit code is this process's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def io_counters() -> dict[str, int]:
    fields = dict(
        line.split(": ", 1) for line in Path("/proc/self/io").read_text().splitlines() if line
    )
    return {name: int(value) for name, value in fields.items()}


def main(argv: list[str]) -> int:
    out, separator, *command = argv
    if separator != "--" or not command:
        raise SystemExit(__doc__)
    before = io_counters()
    returncode = subprocess.call(command)
    after = io_counters()
    Path(out).write_text(json.dumps({name: after[name] - before[name] for name in after}))
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
