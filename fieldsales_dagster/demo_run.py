"""``fieldsales-demo-run``: the whole pipeline against the bundled demo API, in one command.

Starts the demo API on loopback, materializes every asset (and runs every check) into the DuckDB
file, then prints a summary of the tables written.
"""

from __future__ import annotations

import argparse
import os
import sys

import duckdb

from fieldsales_dagster.warehouse.resource import DEFAULT_DUCKDB_PATH


def summarize(database: str) -> str:
    with duckdb.connect(database, read_only=True) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema IN ('raw', 'core') ORDER BY table_schema, table_name"
        ).fetchall()
        rows = [
            (
                f"{schema}.{name}",
                conn.execute(f'SELECT count(*) FROM "{schema}"."{name}"').fetchone()[0],
            )
            for schema, name in tables
        ]
    width = max((len(name) for name, _ in rows), default=5)
    lines = [f"{'table':<{width}}  {'rows':>10}", f"{'-' * width}  {'-' * 10}"]
    lines += [f"{name:<{width}}  {count:>10,}" for name, count in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--database",
        default=DEFAULT_DUCKDB_PATH,
        help=f"DuckDB file to write (default: {DEFAULT_DUCKDB_PATH})",
    )
    args = parser.parse_args(argv)

    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    with DemoServer(DemoConfig(transactions=args.transactions, seed=args.seed)) as server:
        os.environ["FIELDSALES_BASE_URL"] = server.base_url
        os.environ["FIELDSALES_API_TOKEN"] = server.token
        os.environ["FIELDSALES_DUCKDB_PATH"] = args.database
        print(f"Demo API on {server.base_url}; loading into {args.database}", flush=True)

        import dagster as dg

        from fieldsales_dagster.definitions import defs

        job = defs().resolve_implicit_global_asset_job_def()
        with dg.DagsterInstance.ephemeral() as instance:
            result = job.execute_in_process(instance=instance, raise_on_error=False)
        if not result.success:
            print("The run failed; see the log above.", file=sys.stderr)
            return 1
    print()
    print(summarize(args.database))
    return 0


if __name__ == "__main__":
    sys.exit(main())
