"""``fieldsales-demo-run``: the whole pipeline against the bundled demo API, in one command.

It prints each table's rows and checks; a failing check not in ``EXPECTED_DEMO_FINDINGS`` fails
it. The run is kept in ``.dagster_home/``, where ``dg dev`` (``DAGSTER_HOME`` unset) shows it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import dagster as dg
import yaml

from fieldsales_dagster.automation.alerts import root_cause
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.warehouse.lake import move_tenant
from fieldsales_dagster.warehouse.quoting import qualified
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

DEFAULT_DAGSTER_HOME = ".dagster_home"
#: Left out of a home's copy of ``dagster.yaml``: their defaults are that home's own folders.
STORAGE_KEYS = ("storage", "local_artifact_storage", "compute_logs")
#: The same on every start (on a new port), so the token store follows the demo API.
DEMO_TOKEN = "demo-token"

#: Checks that the demo data fails on purpose: (asset, check) -> what in the data trips it.
EXPECTED_DEMO_FINDINGS = {
    ("core_transactions", "event_ids_known"): (
        "the demo API serves some transactions whose event it never lists"
    ),
    ("core_custom_report_results", "field_types_resolved"): (
        "some event reports answer a field no configuration defines ('Altes Feld')"
    ),
    ("core_custom_report_results", "slider_values_valid"): (
        "some slider answers are out of range or off the step grid"
    ),
}


def prepare_dagster_home(home: Path, instance_yaml: Path | None = None) -> Path:
    """Create ``home`` with the project's ``dagster.yaml`` but its storage keys: runs stay in it."""
    home.mkdir(parents=True, exist_ok=True)
    source = instance_yaml or Path("dagster.yaml")  # run from the project folder
    if source.is_file():
        config = yaml.safe_load(source.read_text()) or {}
        settings = {key: value for key, value in config.items() if key not in STORAGE_KEYS}
        text = yaml.safe_dump(settings, sort_keys=False) if settings else ""
        header = f"# Written from {source} by fieldsales-demo-run (its storage keys left out).\n"
        (home / "dagster.yaml").write_text(header + text)
    return home.resolve()


def _note(asset: str, evaluation: dg.AssetCheckEvaluation) -> str:
    finding = EXPECTED_DEMO_FINDINGS.get((asset, evaluation.check_name))
    if evaluation.passed:
        return "passed" + (f" (the demo data usually trips it: {finding})" if finding else "")
    failed = f"FAILED ({evaluation.severity.value})"
    return f"{failed}, as intended: {finding}" if finding else f"{failed}, NOT expected"


def summarize(
    warehouse: FieldSalesWarehouse, evaluations: Sequence[dg.AssetCheckEvaluation]
) -> tuple[str, list[str]]:
    """Row counts with each table's check results; and the unexpected failures."""
    with warehouse.read_connection() as conn:
        tables = conn.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables "
            "WHERE table_schema IN ('raw', 'core', 'mart') "
            "ORDER BY list_position(['raw', 'core', 'mart'], table_schema), table_name"
        ).fetchall()
        rows = [
            (name, one_row(conn, f"SELECT count(*) FROM {qualified(name)}")[0])
            for (name,) in tables
        ]
    width = max((len(name) for name, _ in rows), default=5)
    lines = [f"{'table':<{width}}  {'rows':>10}  checks", f"{'-' * width}  {'-' * 10}  ------"]
    evaluations = sorted(evaluations, key=lambda e: e.check_name)
    for name, count in rows:
        asset = name.replace(".", "_")
        on_table = [e for e in evaluations if e.asset_key.to_user_string() == asset]
        notes = [f"{e.check_name}: {_note(asset, e)}" for e in on_table] or ["-"]
        lines.append(f"{name:<{width}}  {count:>10,}  {notes[0]}")
        lines += [f"{'':{width + 12}}  {note}" for note in notes[1:]]
    failed = [(e.asset_key.to_user_string(), e.check_name) for e in evaluations if not e.passed]
    unexpected = [" / ".join(key) for key in failed if key not in EXPECTED_DEMO_FINDINGS]
    lines.append(
        f"\nchecks: {len(evaluations) - len(failed)} passed, "
        f"{len(failed) - len(unexpected)} failed as the demo data intends, "
        f"{len(unexpected)} failed unexpectedly"
        + (": " + ", ".join(unexpected) if unexpected else "")
    )
    return "\n".join(lines), unexpected


class _Progress(logging.Logger):
    """One line per finished step, and every warning or error; nothing else."""

    done = 0

    def handle(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "dagster_meta", None) or {}
        event, step = meta.get("dagster_event"), meta.get("step_key") or "run"
        if event is None:
            if record.levelno >= logging.WARNING:
                message = meta.get("orig_message", record.getMessage())
                print(f"  {record.levelname.lower()}: {step}: {message}", flush=True)
        elif event.event_type_value == "STEP_SUCCESS":
            self.done += 1
            seconds = event.event_specific_data.duration_ms / 1000
            print(f"  {self.done:>2}. {step} ({seconds:.1f} s)", flush=True)
        elif event.event_type_value == "STEP_FAILURE":
            print(f"  FAILED: {step}: {root_cause(event.event_specific_data.error)}", flush=True)


# config_schema=None (the default) given by position: Dagster types no overload without it.
@dg.logger(None, "Progress of the demo run on the terminal; the full log is in the instance.")
def progress_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    return _Progress("fieldsales_dagster.demo_run.progress")


def run_and_report(loaded: dg.Definitions, instance, warehouse: FieldSalesWarehouse) -> int:
    """Run every asset and check of ``loaded``, print the tables and checks; 0 unless something
    went wrong. The asset selection names the run's target in the UI's runs list."""
    job = loaded.resolve_implicit_global_asset_job_def()
    keys = sorted(job.asset_layer.executable_asset_keys)
    print(
        f"Materializing {len(keys)} assets and their checks in {len(job.graph.nodes)} steps; each "
        "line is a step that finished:",
        flush=True,
    )
    result = job.with_logger_defs({"progress": progress_logger}).execute_in_process(
        run_config={"loggers": {"progress": {}}},
        instance=instance,
        raise_on_error=False,
        asset_selection=keys,
    )
    print()
    if not result.success:
        # No table summary: the lake holds what an earlier run wrote, not this run's work.
        errors = [(e.step_key, e.step_failure_data.error) for e in result.get_step_failure_events()]
        cause = next(
            (f"{step}: {root_cause(error)}" for step, error in errors if error is not None),
            "(no step failed; see the run's log)",
        )
        print(
            f"The run {result.run_id} FAILED, so no table is summarized (the lake's are an earlier "
            f"run's); its full log is in the Dagster instance. The cause:\n  {cause}",
            file=sys.stderr,
        )
        return 1
    text, unexpected = summarize(warehouse, result.get_asset_check_evaluations())
    print(text)
    return 1 if unexpected else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dagster-home", default=DEFAULT_DAGSTER_HOME, help="the run's Dagster home"
    )
    args = parser.parse_args(argv)
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    home = prepare_dagster_home(Path(args.dagster_home))
    config = DemoConfig(transactions=args.transactions, seed=args.seed)
    with DemoServer(config, token=DEMO_TOKEN) as server:
        os.environ.update(FIELDSALES_BASE_URL=server.base_url, FIELDSALES_API_TOKEN=server.token)
        os.environ.update(FIELDSALES_CREATE_DIRS="true", DAGSTER_HOME=str(home))
        os.environ.pop("FIELDSALES_DUCKDB_PATH", None)
        from fieldsales_dagster.definitions import defs

        loaded = defs()
        warehouse = (loaded.resources or {}).get(InstanceNames().warehouse.key)
        assert isinstance(warehouse, FieldSalesWarehouse), "the project defines its warehouse"
        lake = warehouse.lake
        print(f"Demo API on {server.base_url}; lake {lake.catalog}, data in {lake.data_path}")
        # The demo API is one instance on a new port each time: move the tenant record along.
        move_tenant(lake)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            status = run_and_report(loaded, instance, warehouse)
    print(f"\nThe run is recorded in {home}: .venv/bin/dg dev here, DAGSTER_HOME unset, shows it.")
    return status


if __name__ == "__main__":
    sys.exit(main())
