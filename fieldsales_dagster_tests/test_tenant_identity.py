"""Two tenants are told apart by what their catalogs are, never by how they are spelled.

A property test: hypothesis spells one PostgreSQL database (a real server, ``postgres.py``) and
one SQLite file many ways (host name or address, key order, spaces, quotes; relative and absolute
paths, ``./`` and ``..``, links), gives two tenants of one code location a spelling each, and
loads the code location: it is refused exactly when both name one catalog and schema.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fieldsales_dagster_tests.postgres import Postgres, running_postgres
from fieldsales_dagster_tests.project import error_chain, load_project, write_project

#: Few examples: each loads a code location (and asks the server of a new spelling once).
EXAMPLES = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SCHEMAS = st.sampled_from([None, "main", "public", "acme_lake"])


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    with running_postgres("lake") as pg:
        conn = pg.connect()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute('CREATE DATABASE "other"')
        conn.close()
        previous = os.environ.get("FIELDSALES_DUCKLAKE_PASSWORD")
        os.environ["FIELDSALES_DUCKLAKE_PASSWORD"] = pg.password
        try:
            yield pg
        finally:
            os.environ.pop("FIELDSALES_DUCKLAKE_PASSWORD")
            if previous is not None:
                os.environ["FIELDSALES_DUCKLAKE_PASSWORD"] = previous


@st.composite
def postgres_spelling(draw: st.DrawFn, server: Postgres, database: str) -> str:
    """``database`` on ``server`` as a libpq string: any host spelling, key order and spacing."""
    host = draw(st.sampled_from(["localhost", "127.0.0.1", "LOCALHOST"]))
    quote = draw(st.sampled_from(["", "'"]))
    pairs = draw(
        st.permutations(
            [
                f"dbname={quote}{database}{quote}",
                f"host={host}",
                f"port={server.port}",
                f"user={server.user}",
            ]
        )
    )
    spaces = draw(st.lists(st.sampled_from([" ", "  ", " \t "]), min_size=3, max_size=3))
    return "postgres:" + pairs[0] + "".join(s + p for s, p in zip(spaces, pairs[1:], strict=True))


def sqlite_spelling(folder: Path, name: str, how: str) -> str:
    """The file ``folder/name`` spelled ``how``: absolute, relative to the working directory,
    with ``./`` and ``..`` segments, through a link to its folder or to the file."""
    target = folder / "catalogs" / name
    spelled = {
        "absolute": target,
        "relative": Path(os.path.relpath(target)),
        "dots": folder / "catalogs" / "." / ".." / "catalogs" / name,
        "folder link": folder / "linked_folder" / name,
        "file link": folder / f"link_to_{name}",
    }[how]
    return f"sqlite:{spelled}"


def load(folder: Path, catalogs: list[str], schemas: list[str | None], monkeypatch) -> str | None:
    """Load a code location of two tenants with these catalogs and schemas (and files of their
    own otherwise): the refusal's message, ``None`` when it loads."""
    root = Path(tempfile.mkdtemp(dir=folder))
    tenants = {}
    for n, (catalog, schema) in enumerate(zip(catalogs, schemas, strict=True)):
        (root / f"lake{n}").mkdir()
        lines = [
            "api:",
            "  base_url: http://127.0.0.1:9",
            '  api_token: "{{ env.FIELDSALES_API_TOKEN }}"',
            f"  token_store_path: {root / f'token{n}.json'}",
            f"key_prefix: tenant{n}",
            "storage:",
            f'  ducklake_catalog: "{catalog}"',
            f"  ducklake_data_path: {root / f'lake{n}'}",
        ]
        tenants[f"tenant{n}"] = "\n".join(lines + [f"  ducklake_schema: {schema}"] * bool(schema))
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "tenant-identity-token")
    try:
        load_project(write_project(root / "project", tenants), monkeypatch)
    except Exception as exc:
        return error_chain(exc)
    return None


def assert_refused_exactly_when_one(
    refused: str | None, catalogs: list[str], schemas: list[str | None], one: bool
) -> None:
    """Refused when ``one``, naming both spellings (once if they are alike), else loaded."""
    assert (refused is not None) == one, (catalogs, schemas, refused)
    if refused is None:
        return
    assert "tenant0" in refused and "tenant1" in refused
    spelled = [c.removeprefix("sqlite:") if c.startswith("sqlite:") else c for c in catalogs]
    if spelled[0] == spelled[1]:
        assert f"the DuckLake {spelled[0]} (schema " in refused
        assert "(ducklake_catalog of both)" in refused
    else:
        assert f" {spelled[0]} (schema " in refused and f" {spelled[1]} (schema " in refused
        assert "(ducklake_catalog of each: one " in refused


@given(
    data=st.data(),
    databases=st.lists(st.sampled_from(["lake", "other"]), min_size=2, max_size=2),
    schemas=st.lists(SCHEMAS, min_size=2, max_size=2),
)
@EXAMPLES
def test_tenants_naming_one_postgresql_catalog_and_schema_are_refused_at_load(
    server, tmp_path_factory, monkeypatch, data, databases, schemas
):
    catalogs = [data.draw(postgres_spelling(server, database)) for database in databases]
    refused = load(tmp_path_factory.getbasetemp(), catalogs, schemas, monkeypatch)
    # A tenant without a schema has DuckLake's tables in PostgreSQL's default schema, public.
    one = databases[0] == databases[1] and len({s or "public" for s in schemas}) == 1
    assert_refused_exactly_when_one(refused, catalogs, schemas, one)


@pytest.fixture(scope="module")
def sqlite_folder(tmp_path_factory) -> Path:
    """``catalogs/`` with one catalog file made (``made.sqlite``); links to its folder and files."""
    folder = tmp_path_factory.mktemp("sqlite_spellings")
    (folder / "catalogs").mkdir()
    (folder / "catalogs" / "made.sqlite").write_bytes(b"")
    (folder / "linked_folder").symlink_to(folder / "catalogs")
    for name in ("made.sqlite", "new.sqlite", "other.sqlite"):
        (folder / f"link_to_{name}").symlink_to(folder / "catalogs" / name)
    return folder


HOW = st.sampled_from(["absolute", "relative", "dots", "folder link", "file link"])


@given(
    files=st.lists(
        st.sampled_from(["made.sqlite", "new.sqlite", "other.sqlite"]), min_size=2, max_size=2
    ),
    hows=st.lists(HOW, min_size=2, max_size=2),
    schemas=st.lists(SCHEMAS, min_size=2, max_size=2),
)
@EXAMPLES
def test_tenants_naming_one_sqlite_file_and_schema_are_refused_at_load(
    sqlite_folder, monkeypatch, files, hows, schemas
):
    """``new.sqlite`` and ``other.sqlite`` do not exist yet: their folder and name tell them."""
    catalogs = [sqlite_spelling(sqlite_folder, f, h) for f, h in zip(files, hows, strict=True)]
    refused = load(sqlite_folder, catalogs, schemas, monkeypatch)
    one = files[0] == files[1] and len({s or "main" for s in schemas}) == 1
    assert_refused_exactly_when_one(refused, catalogs, schemas, one)
