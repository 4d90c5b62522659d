"""The lake's catalog as a setting spells it: ``sqlite:<file>`` (one host) or
``postgres:<libpq connection string>`` (several machines). It imports nothing of the project."""

POSTGRES_PREFIX = "postgres:"
SQLITE_PREFIX = "sqlite:"
DEFAULT_CATALOG = "sqlite:data/fieldsales.ducklake.sqlite"


def check_catalog(catalog: str) -> str:
    """``catalog`` if it is a catalog this project opens, else a ``ValueError`` saying which."""
    sqlite_file = catalog.startswith(SQLITE_PREFIX) and catalog.removeprefix(SQLITE_PREFIX).strip()
    if sqlite_file or catalog.startswith(POSTGRES_PREFIX):
        return catalog
    raise ValueError(
        "it is neither sqlite:<file> (one host; the default is "
        f"{DEFAULT_CATALOG}) nor postgres:dbname=... host=... user=... (several machines)"
    )
