"""The code location loads the way every Dagster entry point loads it, and importing is free."""

import os
import subprocess
import sys

import dagster as dg

from fieldsales_dagster_tests.project import load_project_defs


def test_package_exposes_the_lazy_definitions_dagster_loads_with_dash_m(monkeypatch):
    import fieldsales_dagster

    # FieldSalesComponent: what `dg list components` finds in the registry module (the package).
    assert dir(fieldsales_dagster) == [
        "FieldSalesComponent",
        "FieldSalesWarehouse",
        "code_location",
    ]
    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "definitions-test-token")
    defs = load_project_defs()
    assert isinstance(defs, dg.Definitions)
    defs.get_repository_def()


def test_importing_every_module_builds_nothing_and_reads_no_environment():
    """Each module is imported in a fresh interpreter whose os.environ records every read."""
    script = """
import importlib, os, pkgutil, sys
import fieldsales_dagster
reads = []
class Recording(dict):
    def __getitem__(self, key): reads.append(key); return super().__getitem__(key)
    def get(self, key, default=None): reads.append(key); return super().get(key, default)
    def __contains__(self, key): reads.append(key); return super().__contains__(key)
os.environ = Recording(os.environ)
names = [m.name for m in pkgutil.walk_packages(fieldsales_dagster.__path__, "fieldsales_dagster.")]
for name in names:
    importlib.import_module(name)
fieldsales = [r for r in reads if str(r).startswith(("FIELDSALES", "DAGSTER_HOME"))]
print(len(names), fieldsales)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(out[0]) >= 20
    assert out[1:] == ["[]"]


def test_demo_api_imports_none_of_the_pipeline():
    script = (
        "import sys, fieldsales_dagster.demo_api, fieldsales_dagster.demo_api.__main__; "
        "print(sorted(m for m in sys.modules if m.startswith(('fieldsales_dagster', 'dagster'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    loaded = eval(out)  # a list of module names
    assert all(
        m == "fieldsales_dagster" or m.startswith("fieldsales_dagster.demo_api") for m in loaded
    )


def test_loading_the_definitions_imports_no_sql_parser_and_no_http_client(tmp_path):
    """What the CLI, each run and the UI pay before any work: sqlglot (parsing) only where a
    query is not in the lineage cache, ``requests`` only where a request is sent."""
    script = """
import sys
from fieldsales_dagster.definitions import defs
defs().get_repository_def()
loaded = {m.split(".")[0] for m in sys.modules}
print(sorted(loaded & {"sqlglot", "requests", "charset_normalizer"}))
"""
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path),  # a cache of its own: the first load parses
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": "definitions-test-token",
    }

    def load() -> list[str]:
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env
        )
        assert run.returncode == 0, run.stderr[-2000:]
        return eval(run.stdout.strip().splitlines()[-1])  # a list of module names

    assert load() == ["sqlglot"]  # a cold cache: the queries are parsed, once per machine
    assert load() == []


def test_the_definitions_are_built_once_per_process_for_the_same_environment(monkeypatch):
    from fieldsales_dagster import definitions

    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "definitions-test-token")
    first = load_project_defs()
    assert load_project_defs() is first  # what Dagster asks for several times in one run
    built = definitions._definitions.cache_info().misses

    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.2:9")
    again = load_project_defs()
    assert again is not first
    assert definitions._definitions.cache_info().misses == built + 1
    (api,) = [
        resource
        for key, resource in again.resources.items()
        if key.endswith("fieldsales_api") or key == "fieldsales_api"
    ]
    assert api.base_url == "http://127.0.0.2:9"


def test_the_definitions_load_without_the_libraries_only_a_load_uses():
    """numpy, pyarrow and pandas cost the CLI's start-up and every code-server reload (numpy
    alone ~0.1 s); only a run's raw load and the IO manager need them."""
    script = (
        "import os, sys; os.environ['FIELDSALES_BASE_URL'] = 'http://127.0.0.1:9'; "
        "os.environ['FIELDSALES_API_TOKEN'] = 'load-test-token'; "
        "from fieldsales_dagster.definitions import defs; defs(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pyarrow', 'pandas'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_loading_the_definitions_prints_no_beta_warning():
    """The definitions use no beta parameter, directly or through a rebuild Dagster makes of them
    (a sensor holding a job Dagster binds to resources was rebuilt with ``owners``, in beta).
    docs/web-ui.md names the warnings Dagster's own commands still print."""
    script = "from fieldsales_dagster.definitions import defs\ndefs().get_repository_def()\n"
    env = {
        **os.environ,
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": "definitions-test-token",
    }
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "BetaWarning" not in run.stderr and "PreviewWarning" not in run.stderr, run.stderr
