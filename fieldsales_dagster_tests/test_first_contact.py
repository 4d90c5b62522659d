"""What a newcomer meets first: the docs name only what exists and count right, their links
resolve, the README stays a front page, the documented commands warn about nothing, `make`
installs only when it must, and a bad setting ends the output.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient

from fieldsales_dagster_tests.processes import process_group
from fieldsales_dagster_tests.project import load_project_defs

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: The front page and the documentation pages (docs/*.md): what the user reads.
USER_DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
DOCS = [*USER_DOCS, "deploy/README.md", "benchmarks/README.md"]
#: The README is a front page: what it is, the set-up, a short tour, links.
README_MAX_LINES = 160
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


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """The anchors of a markdown file's headings (outside code blocks)."""
    found, in_code = set(), False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (heading := re.match(r"^#{1,6} (.+)$", line)):
            found.add(github_anchor(heading[1]))
    return found


def broken_links(doc: Path) -> list[str]:
    """Relative links of ``doc`` whose file, or whose #anchor in that file, does not exist."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("name", USER_DOCS)
def test_every_relative_link_of_the_readme_and_the_docs_resolves_to_a_file_and_heading(name):
    assert broken_links(ROOT / name) == [], f"{name} links what does not exist"


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n```\n# not a heading\n```\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# The `dg` commands: here\n[a](other.md#other-page) [b](#the-dg-commands-here) "
        "[c](gone.md) [d](other.md#not-a-heading) [e](https://example.com/x#y)\n"
    )
    assert broken_links(doc) == [
        "gone.md (no such file)",
        "other.md#not-a-heading (no such heading)",
    ]


def test_the_readme_is_a_front_page_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    # The SPEC's two set-up commands, exactly.
    assert "\nmake demo\n" in readme and "\nmake test\n" in readme
    linked = {target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", readme)}
    assert {name for name in USER_DOCS if name != "README.md"} <= linked


def test_the_path_check_sees_what_it_must():
    # The checks above only mean something if the scanner finds paths in prose and code.
    found = named_paths(
        "see `deploy/docker/dagster.yaml` or fieldsales_dagster/sql/core_*.sql, not data/x.duckdb"
    )
    assert found == {"deploy/docker/dagster.yaml", "fieldsales_dagster/sql/core_*.sql"}


# --- counts and commands -----------------------------------------------------------------------


def test_the_docs_count_the_assets_the_definitions_hold(monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "first-contact-token")
    assets = len(load_project_defs().resolve_all_asset_keys())
    for name in {*USER_DOCS, "README.md"}:  # a count the docs state is the definitions' own
        counts = {int(n) for n in re.findall(r"\b(\d+) assets\b", (ROOT / name).read_text())}
        assert counts <= {assets}, f"{name} says {counts} assets; the definitions hold {assets}"


def doc_commands(name: str) -> list[str]:
    """Every shell line of a doc: its bash blocks and its inline `.venv/bin/...` commands."""
    text = (ROOT / name).read_text()
    lines = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S):
        lines += [line.strip() for line in block.splitlines() if line.strip()]
    lines += re.findall(r"`([^`]*\.venv/bin/[^`]*)`", text)
    return lines


def readme_commands() -> list[str]:
    """The shell lines of the README and of every docs page."""
    return [line for name in USER_DOCS for line in doc_commands(name)]


def test_readme_commands_use_no_superseded_dagster_cli():
    commands = readme_commands()
    assert any("dg launch" in line for line in commands)
    # `dagster asset materialize` prints a SupersessionWarning pointing at `dg launch`; `dagster
    # dev` is superseded by `dg dev`.
    superseded = [
        line for line in commands if re.search(r"\bdagster (asset materialize|dev)\b", line)
    ]
    assert not superseded


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """The webserver logs "Serving dagster-webserver" before uvicorn binds its port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


#: docs/web-ui.md: Ctrl-C or `kill -INT` stops `dg dev` in a few seconds (a guard, not a timing).
DG_DEV_STOP_S = 60


def interruptible() -> None:
    """Start a process as a terminal (or a script after `set -m`) does: SIGINT not ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_dg_dev_as_documented_starts_without_a_warning_and_stops_on_sigint(tmp_path):
    """The docs' `dg dev`, DAGSTER_HOME unset: no "dagster.yaml ... will not be used"; and, as
    docs/web-ui.md says, SIGINT stops it and it removes its `.tmp_dagster_home_*`."""
    documented = [
        name
        for name in USER_DOCS
        if any(line.startswith(".venv/bin/dg dev") for line in doc_commands(name))
    ]
    assert "README.md" in documented
    for name in documented:
        commands = doc_commands(name)
        starts = [i for i, line in enumerate(commands) if line.startswith(".venv/bin/dg dev")]
        for at in starts:
            assert any(line.startswith("unset DAGSTER_HOME") for line in commands[:at]), name
            assert not any("DAGSTER_HOME=" in line for line in commands[:at]), name
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
            preexec_fn=interruptible,
        )
    try:
        deadline = time.monotonic() + 120
        while "Serving dagster-webserver" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.5)
        output = log.read_text(errors="replace")
        assert " - WARNING - " not in output, output
        assert "will not be used to configure Dagster" not in output
        # Stopped as the docs say: `kill -INT <pid>` (Ctrl-C sends the same to the group).
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(DG_DEV_STOP_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"dg dev still runs {DG_DEV_STOP_S} s after SIGINT:\n{tail(log)}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log.read_text(errors="replace")
    (home,) = re.findall(r"Using temporary directory (\S+) for storage", output)
    assert Path(home).name.startswith(".tmp_dagster_home_") and not Path(home).exists(), output


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
    "Field-Sales setting api.page_size (from FIELDSALES_PAGE_SIZE) is invalid: it is out of range. "
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


# --- a fresh clone -------------------------------------------------------------------------------


def fresh_clone(tmp_path: Path) -> Path:
    """The project's files as a clone has them: no data/, no .dagster_home/, no caches."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("pyproject.toml", "workspace.yaml", "dagster.yaml"):
        (clone / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(
        ROOT / "fieldsales_dagster",
        clone / "fieldsales_dagster",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return clone


def clean_clone_env(**extra: str) -> dict[str, str]:
    """The environment of a newcomer: only the base URL and the token set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIELDSALES_", "DAGSTER_"))}
    return {
        **env,
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": "t",
        **extra,
    }


def test_defaults_load_in_a_fresh_clone_with_only_the_url_and_the_token(tmp_path):
    clone = fresh_clone(tmp_path)
    for command in (["check", "defs"], ["list", "defs", "--json"]):
        done = subprocess.run(
            [str(BIN / "dg"), *command],
            cwd=clone,
            env=clean_clone_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert '"renew_token"' in done.stdout
    assert not (clone / "data").exists()  # loading creates nothing; the run that writes does


def test_a_path_the_user_set_must_exist_and_its_error_ends_dg_launch(tmp_path):
    clone = fresh_clone(tmp_path)
    mistyped = tmp_path / "volumne" / "fieldsales.duckdb"
    done = subprocess.run(
        [str(BIN / "dg"), "launch", "--assets", "*"],
        cwd=clone,
        env=clean_clone_env(
            FIELDSALES_DUCKDB_PATH=str(mistyped), DAGSTER_HOME=str(dagster_home(tmp_path))
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert f"is in a folder that does not exist ({mistyped.parent})" in lines[-1], lines[-15:]
    assert "fieldsales_dagster/defs/fieldsales/defs.yaml is not configured correctly" in lines[-2]
    assert "<instance>" not in done.stdout + done.stderr
    assert not mistyped.parent.exists()


def group_members(pgid: int) -> list[str]:
    """The command lines of the live processes of process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            state, _, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            if entry.name.isdigit() and int(group) == pgid and state != "Z":
                found.append((entry / "cmdline").read_text().replace("\0", " ").strip())
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.silent_failures_expected  # the interrupted step fails with no message of its own
def test_dg_dev_with_a_run_in_flight_stops_as_documented(demo_env, tmp_path):
    """docs/web-ui.md: `kill -INT <pid>` stops `dg dev` but its code server keeps the run going;
    SIGINT to the process group (what Ctrl-C sends) interrupts the run, marks it failed, and
    ends every process of `dg dev`."""
    clone = fresh_clone(tmp_path)
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"},
        "FIELDSALES_TEST_PAUSE_AT": "loading",
    }
    log = tmp_path / "dg_dev.log"
    argv = [str(BIN / "dg"), "dev", "--port", str(port)]

    def wait_for(done, what: str, seconds: float = DG_DEV_STOP_S) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, f"{what}:\n{tail(log)}"
            time.sleep(0.5)

    with process_group(argv, log, env, cwd=clone, preexec_fn=interruptible) as proc:
        wait_for(lambda: listening(port), "no UI", seconds=120)
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        run_id = client.submit_job_execution("refresh_all")
        # dg dev's output carries the run's step output, the pause hook's line included.
        wait_for(lambda: "paused at loading" in log.read_text(errors="replace"), "no pause")
        proc.send_signal(signal.SIGINT)  # `kill -INT <pid>`: dg dev alone
        wait_for(lambda: proc.poll() is not None, "dg dev still runs after SIGINT")
        instance = dg.DagsterInstance.from_config(str(clone / ".dagster_home"))
        with instance:
            assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.STARTED
            assert any("code-server start" in line for line in group_members(proc.pid))
            os.killpg(proc.pid, signal.SIGINT)  # `kill -INT -- -<pid>`: what Ctrl-C sends
            wait_for(lambda: not group_members(proc.pid), "processes left after group SIGINT")
            assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
