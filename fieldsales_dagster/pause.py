"""A test hook: hold the process at a named phase, so that a test can kill it exactly there.

``FIELDSALES_TEST_PAUSE_AT=<phase>`` makes ``pause_at(<phase>)`` say ``paused at <phase>`` on
stderr and sleep until the process is killed (``fieldsales_dagster_tests/test_operate.py``).
Unset, as it always is outside that test, ``pause_at`` returns at once and does nothing. Phases:
``loading``, ``merge``, ``core``, ``export``, ``token_store``.
"""

import os
import sys
import time

VARIABLE = "FIELDSALES_TEST_PAUSE_AT"


def pause_at(phase: str) -> None:
    if os.environ.get(VARIABLE) != phase:
        return
    sys.stderr.write(f"{VARIABLE}: paused at {phase}\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)
