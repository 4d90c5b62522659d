"""Load the three list endpoints into DuckDB with dlt's ``rest_api`` source (the comparison).

    FIELDSALES_API_TOKEN=... python benchmarks/dlt_load.py --base-url URL --database FILE \
        --mode fast|default --pipelines-dir DIR

``--mode fast``: ``max_table_nesting=0`` (each item one row, nested objects and lists as JSON
columns) and ``loader_file_format="jsonl"``. ``--mode default``: dlt's defaults (nested lists
become child tables, nested objects flattened into columns, ``insert_values`` files).

Pagination is dlt's ``offset`` paginator: ``skip``/``limit`` with ``limit`` 1000, stopping at the
total (``count`` for transactions, ``total`` for event groups) or, for events, which carry no
total, at the first empty page. dlt pages each list one request after another.

The token comes from the environment only. Prints one JSON line with the load's row counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PAGE_SIZE = 1000
DATASET = "fieldsales"


def _paginator(total_path: str | None, page_size: int) -> dict:
    paginator: dict = {
        "type": "offset",
        "limit": page_size,
        "offset_param": "skip",
        "limit_param": "limit",
        "total_path": total_path,
    }
    if total_path is None:
        paginator["stop_after_empty_page"] = True
    return paginator


def rest_api_config(base_url: str, token: str, page_size: int = PAGE_SIZE) -> dict:
    return {
        "client": {
            "base_url": base_url.rstrip("/") + "/",
            "auth": {"type": "bearer", "token": token},
            "headers": {"Accept": "application/json"},
        },
        "resource_defaults": {"write_disposition": "replace"},
        "resources": [
            {
                "name": "events",
                "endpoint": {
                    "path": "public/v1/api/event/all",
                    "data_selector": "$",  # a bare JSON list
                    "paginator": _paginator(None, page_size),
                },
            },
            {
                "name": "transactions",
                "endpoint": {
                    "path": "public/v1/api/transaction/all",
                    "data_selector": "transactions",
                    "paginator": _paginator("count", page_size),
                },
            },
            {
                "name": "event_groups",
                "endpoint": {
                    "path": "public/v1/api/eventgroup/all",
                    "data_selector": "data",
                    "paginator": _paginator("total", page_size),
                },
            },
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--database", required=True, help="DuckDB file to write")
    parser.add_argument("--mode", choices=("fast", "default"), default="fast")
    parser.add_argument("--page-size", type=int, default=PAGE_SIZE)
    parser.add_argument("--pipelines-dir", required=True, help="dlt's working folder")
    parser.add_argument(
        "--parallelized",
        action="store_true",
        help="extract the three resources in parallel threads (off in the benchmark)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("FIELDSALES_API_TOKEN")
    if not token:
        print("set FIELDSALES_API_TOKEN", file=sys.stderr)
        return 2
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")

    import dlt
    from dlt.sources.rest_api import rest_api_source

    source_kwargs: dict = {"name": "fieldsales", "parallelized": args.parallelized}
    run_kwargs: dict = {}
    if args.mode == "fast":
        source_kwargs["max_table_nesting"] = 0
        run_kwargs["loader_file_format"] = "jsonl"

    started = time.perf_counter()
    source = rest_api_source(rest_api_config(args.base_url, token, args.page_size), **source_kwargs)
    pipeline = dlt.pipeline(
        pipeline_name=f"fieldsales_bench_{args.mode}",
        destination=dlt.destinations.duckdb(credentials=args.database),
        dataset_name=DATASET,
        pipelines_dir=args.pipelines_dir,
        progress="log",
    )
    pipeline.run(source, **run_kwargs)
    seconds = time.perf_counter() - started
    trace = pipeline.last_trace
    rows = trace.last_normalize_info.row_counts if trace and trace.last_normalize_info else {}
    stages = {
        step.step: round((step.finished_at - step.started_at).total_seconds(), 2)
        for step in (trace.steps if trace else [])
        if step.started_at and step.finished_at
    }
    result = {
        "mode": args.mode,
        "dataset": DATASET,
        "row_counts": rows,
        "stage_seconds": stages,
        "seconds": round(seconds, 2),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
