"""File settings: a symlink is followed, so the pipeline's rename replaces its target. A folder
is made only with ``create_dirs`` or for the default under data/: a mistyped volume path must never
fill the disk."""

from __future__ import annotations

import contextlib
import os
import posixpath
import urllib.parse
from collections.abc import Callable, Hashable
from pathlib import Path

from fieldsales_dagster.settings import SETTINGS, SettingError, named, setting_error

#: A path setting's failure: why, then what to do.
Fail = Callable[[str, str], SettingError]


def resolved(path: str | Path) -> Path:
    """``path`` with every symlink followed (a dangling link gives the file it would create)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def identity(path: str | Path) -> tuple[Hashable, ...]:
    """What ``path`` names, however spelled: device and inode after links (of the nearest
    existing folder, and the names below, for one not created yet)."""
    target = resolved(path)
    found = next(p for p in (target, *target.parents) if p.exists() or p == p.parent)
    below = target.relative_to(found).parts
    return (found.stat().st_dev, found.stat().st_ino, *below)


def locations(folder: str) -> tuple[Hashable, ...]:
    """The ``identity`` of a folder, then of every folder that holds it: two folders overlap when
    either's first is in the other's. For object storage (``s3://bucket/prefix``) the scheme,
    bucket and prefix; the endpoint is the environment's, one for a whole code location."""
    if "://" not in folder:
        target = resolved(folder)
        return tuple(identity(each) for each in (target, *target.parents))
    url = urllib.parse.urlsplit(folder)
    parts = [p for p in posixpath.normpath("/" + url.path).split("/") if p]
    return tuple(
        (url.scheme.lower(), url.netloc.lower(), *parts[:n]) for n in range(len(parts), -1, -1)
    )


def check_file_setting(
    path: str | Path, *, setting: str, create_dirs: bool, create: bool = False
) -> Path:
    """The resolved ``path``, once it is known that the pipeline can replace the file there;
    ``create``: make a missing folder now. Else a ``SettingError`` (``_target``)."""
    create_dirs = create_dirs or str(path) == SETTINGS[setting].default
    target, fail = _target(path, setting)
    _check_whitespace(target, fail)
    if target.is_dir():
        raise fail(
            "is a directory, not a file",
            f"Give the path of a file in it, e.g. {target / _EXAMPLE_NAMES[setting]}",
        )
    _check_folder(target.parent, fail, create_dirs, create)
    return target


def check_folder_setting(path: str | Path, *, setting: str, what: str = "") -> Path:
    """The nearest existing folder at or above the folder ``path`` (``what``: which of
    ``setting``'s), once it is known that the pipeline can write there (or make it)."""
    target, fail = _target(path, setting, what)
    return _check_folder(target, fail, create_dirs=True, create=False)


_EXAMPLE_NAMES = {
    "duckdb_path": "fieldsales.duckdb",
    "token_store_path": "fieldsales_token.json",
    "ducklake_catalog": "fieldsales.ducklake.sqlite",
}


def _target(path: str | Path, setting: str, what: str = "") -> tuple[Path, Fail]:
    """``path`` resolved, and its failure: the setting, variable, path as given, what to do."""
    given = Path(path).expanduser()
    target = resolved(given)
    shown = str(given) if target == given.absolute() else f"{given} (a link to {target})"

    def fail(why: str, what_to_do: str) -> SettingError:
        return setting_error(setting, f"{what}{shown} {why}. {what_to_do}")

    return target, fail


def _check_whitespace(target: Path, fail: Fail) -> None:
    """Refuse a name with whitespace around it, or one differing only so from a file beside it:
    a stray space would write new files while analysts read the other."""
    name = target.name
    if name != name.strip():
        raise fail(
            "has whitespace around its name", "Remove it (often a stray space in an env file)"
        )
    twin: os.DirEntry[str] | None = None
    with contextlib.suppress(OSError):  # no folder yet (or none readable): _check_folder says so
        twin = next(
            (e for e in os.scandir(target.parent) if e.name.strip() == name != e.name), None
        )
    if twin:
        raise fail(
            f"differs only by whitespace from {twin.path!r}, which exists",
            "Keep one of the two and point the setting at it",
        )


def _check_folder(folder: Path, fail: Fail, create_dirs: bool, create: bool) -> Path:
    """Fail unless ``folder`` exists (or may be created: ``create_dirs``) and is writable, then
    create it (``create``); returns the nearest existing folder at or above it."""
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise fail(
            f"cannot be created: {existing} is a file, not a folder",
            "Move that file away or choose another path",
        )
    if existing != folder and not create_dirs:
        raise fail(
            f"is in a folder that does not exist ({folder})",
            f"Create it (mkdir -p {folder}), set {named('FIELDSALES_CREATE_DIRS')}=true, or fix "
            "the path",
        )
    if os.statvfs(existing).f_flag & os.ST_RDONLY:  # it exists: stat works
        raise fail(
            f"is in a folder this user cannot write ({existing}: a read-only file system)",
            f"Mount {existing} read-write",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise fail(
            f"is in a folder this user cannot write ({existing})",
            f"Give the user running Dagster (uid {os.getuid()}) write access to {existing}",
        )
    if create:  # below a writable folder: only a race or a full disk can fail it (OSError says)
        folder.mkdir(parents=True, exist_ok=True)
    return existing
