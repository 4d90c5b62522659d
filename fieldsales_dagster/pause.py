"""A test hook: ``FIELDSALES_TEST_PAUSE_AT=<phase>`` makes ``pause_at(<phase>)`` hold the process
there (saying so on stderr) until a test kills it (``test_operate.py``); unset, it does nothing."""

import os
import sys
import time

VARIABLE = "FIELDSALES_TEST_PAUSE_AT"


def pause_at(phase: str) -> None:
    if os.environ.get(VARIABLE) == phase:
        print(f"{VARIABLE}: paused at {phase}", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
