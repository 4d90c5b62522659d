"""What a newcomer meets first: the docs name only what exists and count right, the README's
commands warn about nothing, `make` installs only when it must, and a bad setting ends the output.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fieldsales_dagster_tests.project import load_project_defs

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOCS = ["README.md", "deploy/README.md", "benchmarks/README.md"]
#: Files whose text names repository paths too (comments included).
CONFIG_FILES = [
    "deploy/dagster.yaml",
    "deploy/run_launcher.docker.yaml",
    "deploy/run_launcher.k8s.yaml",
    "deploy/docker-compose.yaml",
    "deploy/workspace.docker.yaml",
    "dagster.yaml",
    "Dockerfile",
    ".dockerignore",
    "Makefile",
]
#: Paths the docs name as examples of what a user creates, not as files of the repository.
EXAMPLES = {
    "fieldsales_dagster/defs/acme/defs.yaml",
    # "Build on it": where a team puts its own assets; by design not in the default location.
    "fieldsales_dagster/defs/analytics/",
}
#: A path-like token: folders and a file name, a glob star allowed in the last part.
_PATH = re.compile(r"(?<![\w./$<-])((?:\.?[\w-]+/)+[\w.*-]*)")


def top_level_entries() -> set[str]:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {path.split("/")[0] for path in tracked} | {path.name for path in ROOT.iterdir()}


def git_ignored(path: str) -> bool:
    """Folders a command creates (benchmarks/work/), never part of a clone."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0


def dagster_home(tmp_path: Path) -> Path:
    """A Dagster home as `make demo` writes one: the project's dagster.yaml (so no telemetry
    notice), without the storage keys that point at the project's .dagster_home/."""
    from fieldsales_dagster.demo_run import prepare_dagster_home

    return prepare_dagster_home(tmp_path / "dagster_home", ROOT / "dagster.yaml")


def named_paths(text: str) -> set[str]:
    """Every repository-relative path in ``text``: tokens starting with a top-level entry."""
    entries = top_level_entries() - {".venv", "data", ".dagster_home"}
    found = set()
    for token in _PATH.findall(text):
        token = token.rstrip(".")
        if token.split("/")[0] in entries and "<" not in token:
            found.add(token)
    return found


@pytest.mark.parametrize("name", DOCS + CONFIG_FILES)
def test_every_repository_path_a_doc_names_exists(name):
    text = (ROOT / name).read_text()
    missing = [
        path
        for path in sorted(named_paths(text) - EXAMPLES)
        if not list(ROOT.glob(path.rstrip("/"))) and not git_ignored(path)
    ]
    assert not missing, f"{name} names files that are not in the repository: {missing}"


@pytest.mark.parametrize("name", DOCS)
def test_links_stay_inside_the_repository_and_resolve(name):
    doc = ROOT / name
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"^[a-z]+://", target):
            continue
        resolved = (doc.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{name} links {target}, outside the repository"
        assert resolved.exists(), f"{name} links {target}, which does not exist"


def test_the_path_check_sees_what_it_must():
    # The checks above only mean something if the scanner finds paths in prose and code.
    found = named_paths(
        "see `deploy/docker/dagster.yaml` or fieldsales_dagster/sql/core_*.sql, not data/x.duckdb"
    )
    assert found == {"deploy/docker/dagster.yaml", "fieldsales_dagster/sql/core_*.sql"}


# --- counts and commands -----------------------------------------------------------------------


def test_readme_counts_the_assets_the_definitions_hold(monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "first-contact-token")
    assets = len(load_project_defs().resolve_all_asset_keys())
    readme = (ROOT / "README.md").read_text()
    counts = {int(n) for n in re.findall(r"\b(\d+) assets\b", readme)}
    assert counts == {assets}, f"README says {counts} assets; the definitions hold {assets}"


def readme_commands() -> list[str]:
    """Every shell line of the README: its bash blocks and its inline `.venv/bin/...` commands."""
    readme = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", readme, flags=re.S):
        lines += [line.strip() for line in block.splitlines() if line.strip()]
    lines += re.findall(r"`([^`]*\.venv/bin/[^`]*)`", readme)
    return lines


def test_readme_commands_use_no_superseded_dagster_cli():
    commands = readme_commands()
    assert any("dg launch" in line for line in commands)
    # `dagster asset materialize` prints a SupersessionWarning pointing at `dg launch`; `dagster
    # dev` is superseded by `dg dev`.
    superseded = [
        line for line in commands if re.search(r"\bdagster (asset materialize|dev)\b", line)
    ]
    assert not superseded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dg_dev_as_documented_starts_without_a_warning(tmp_path):
    """The README's `dg dev`, DAGSTER_HOME unset: no "dagster.yaml ... will not be used"."""
    commands = readme_commands()
    (at,) = [i for i, line in enumerate(commands) if line.startswith(".venv/bin/dg dev")]
    assert any(line.startswith("unset DAGSTER_HOME") for line in commands[:at])
    assert not any("DAGSTER_HOME=" in line for line in commands[:at])
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"},
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": "first-contact-token",
        "FIELDSALES_DUCKLAKE_CATALOG": f"sqlite:{tmp_path / 'fieldsales.ducklake.sqlite'}",
    }
    log = tmp_path / "dg_dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "dg"), "dev", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "Serving dagster-webserver" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log.read_text(errors="replace")
    assert " - WARNING - " not in output, output
    assert "will not be used to configure Dagster" not in output


# --- the Makefile ------------------------------------------------------------------------------


def test_make_installs_again_only_when_pyproject_changes(tmp_path):
    """`make demo` twice installs once; touching pyproject.toml installs again."""
    for name in ("Makefile", "pyproject.toml"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    calls = tmp_path / "calls.log"
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    # A stand-in interpreter and demo that record their arguments (no real install here).
    for tool in ("python", "fieldsales-demo-run"):
        script = venv_bin / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {shlex.quote(str(calls))}\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def make(*targets: str) -> list[str]:
        before = calls.read_text().splitlines() if calls.exists() else []
        subprocess.run(["make", "-s", *targets], cwd=tmp_path, check=True, capture_output=True)
        return calls.read_text().splitlines()[len(before) :]

    installs = "python -m pip install --quiet -e ."
    assert make("demo") == [installs, "fieldsales-demo-run "]
    assert make("demo") == ["fieldsales-demo-run "]
    time.sleep(1.1)  # make compares modification times
    (tmp_path / "pyproject.toml").touch()
    assert make("demo") == [installs, "fieldsales-demo-run "]
    assert make("demo") == ["fieldsales-demo-run "]


# --- a bad setting: its cause is what the output ends with -------------------------------------


def bad_setting_env(tmp_path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("FIELDSALES_")},
        "DAGSTER_HOME": str(dagster_home(tmp_path)),
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": "first-contact-token",
        "FIELDSALES_PAGE_SIZE": "0",
        "FIELDSALES_DUCKLAKE_CATALOG": f"sqlite:{tmp_path / 'fieldsales.ducklake.sqlite'}",
    }


CAUSE = (
    "Field-Sales setting page_size (from FIELDSALES_PAGE_SIZE) is invalid: it is out of range. "
    "Got 0. It takes a whole number from 1 to 10000"
)


def test_a_bad_setting_is_the_last_thing_dg_launch_prints(tmp_path):
    done = subprocess.run(
        [str(BIN / "dg"), "launch", "--assets", "*"],
        cwd=ROOT,
        env=bad_setting_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert CAUSE in lines[-1], "\n".join(lines[-15:])
    assert "fieldsales_dagster/defs/fieldsales/defs.yaml is not configured correctly" in lines[-2]
    assert len(lines) < 80, f"{len(lines)} lines:\n" + "\n".join(lines)


def test_configuration_problems_are_found_under_dagsters_wrapping():
    from fieldsales_dagster.definitions import configuration_problems
    from fieldsales_dagster.tenancy import TenantConflictError

    def wrapped(cause: Exception) -> Exception:
        try:
            try:
                raise cause
            except Exception as inner:
                raise RuntimeError("Error while loading component acme[0]:") from inner
        except RuntimeError as outer:
            return outer

    clash = TenantConflictError("Field-Sales components defs/a and defs/b share duckdb_path")
    assert configuration_problems(wrapped(clash)) == [str(clash)]
    assert configuration_problems(wrapped(KeyError("a bug, not a setting"))) == []


def test_dg_check_defs_as_documented_never_says_success_for_a_failing_load(tmp_path):
    done = subprocess.run(
        [str(BIN / "dg"), "check", "defs", "--no-check-yaml"],
        cwd=ROOT,
        env=bad_setting_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    assert done.returncode != 0
    assert "successfully" not in output, output
    # dg's error block starts with the cause, and only a few lines of frames follow it.
    (at,) = [i for i, line in enumerate(output.splitlines()) if CAUSE in line]
    assert len(output.splitlines()) - at < 12, output
    # The README documents this form of the command.
    assert "dg check defs --no-check-yaml" in " ".join(readme_commands())


# --- the deploy guide (the Dockerfile and the compose file: test_docker_image.py) -------------


def test_every_non_loopback_bind_in_the_guide_warns_that_the_ui_has_no_authentication():
    guide = (ROOT / "deploy" / "README.md").read_text()
    paragraphs = re.split(r"\n\s*\n", guide)
    binds = [p for p in paragraphs if "0.0.0.0" in p and "dagster-webserver" in p]
    assert binds
    for paragraph in binds:
        assert "no authentication" in paragraph and "reverse proxy" in paragraph, paragraph
