"""The CPU seconds of each DuckDB statement a run's steps execute, to find where a step's CPU goes.

``step_cpu.py`` says what a step cost; this says which of its statements did. It runs ``dagster``
with its arguments in this process, the warehouse's connections wrapped so that every
``execute`` is timed in process CPU (every thread's: DuckDB's workers included, and so any work
they finish after a statement returns is charged to the next one), and writes one line per
statement to ``OUT``: CPU seconds, the core or raw asset whose step ran it, the project's
functions that called it, and the statement's start. Set the run's environment as for any run
(``FIELDSALES_*``, ``DAGSTER_HOME``); then sum by step with ``sort``/``awk``:

    python -m benchmarks.sql_cpu /tmp/nightly.sql-cpu asset materialize -m fieldsales_dagster \
        --select core_events,core_custom_report_results
    awk -F' [|] ' '{s[$2] += $1} END {for (k in s) print s[k], k}' /tmp/nightly.sql-cpu | sort -rn
"""

from __future__ import annotations

import atexit
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import fieldsales_dagster.warehouse.warehouse as warehouse_module

STEP_FUNCTIONS = ("_core_table", "_raw_asset")


def _step() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in STEP_FUNCTIONS and "key" in frame.f_locals:
            return frame.f_locals["key"].to_user_string()
        frame = frame.f_back
    return "?"


class TimedConnection:
    """A DuckDB connection whose ``execute`` appends (CPU s, step, callers, SQL) to ``log``."""

    def __init__(self, conn: Any, log: list[tuple[float, str, str, str]]) -> None:
        self._conn, self._log = conn, log

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        result = self._conn.execute(sql, *args, **kwargs)
        spent = time.process_time() - started
        ours = [
            f for f in traceback.extract_stack(limit=12)[:-1] if "fieldsales_dagster" in f.filename
        ]
        callers = " < ".join(f"{Path(f.filename).stem}.{f.name}" for f in reversed(ours[-3:]))
        self._log.append((spent, _step(), callers, " ".join(sql.split())[:160]))
        return self if result is self._conn else result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __enter__(self) -> TimedConnection:
        self._conn.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._conn.__exit__(*exc)


def main(out: Path, dagster_args: list[str]) -> None:
    log: list[tuple[float, str, str, str]] = []
    connect = warehouse_module.writer_connection
    warehouse_module.writer_connection = lambda *a, **k: TimedConnection(connect(*a, **k), log)  # type: ignore[assignment]

    def write() -> None:
        out.write_text(
            "".join(f"{cpu:7.3f} | {step} | {at} | {sql}\n" for cpu, step, at, sql in log)
        )

    atexit.register(write)
    from dagster._cli import main as dagster_main

    sys.argv = ["dagster", *dagster_args]
    dagster_main()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
