"""One asset that does nothing: what a ``dagster asset materialize`` run costs before any work.

The incremental scenario measures it beside the project's runs, as the floor under any refresh
started from the command line (interpreter, imports, instance, run records, exit).
"""

import dagster as dg


@dg.asset
def noop() -> None:
    """Does nothing."""


defs = dg.Definitions(assets=[noop])
