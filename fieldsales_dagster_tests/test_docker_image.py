"""The Docker image, as far as this machine allows: no container engine runs here.

The `Dockerfile` is parsed with Docker's own parser (the ``dockerfile`` package wraps BuildKit's),
and its steps are carried out for real in a temporary root that stands for the image's file
system: ``COPY`` copies from the build context (what ``.dockerignore`` leaves, as Docker's client
computes it), ``WORKDIR`` and ``ENV`` apply, ``RUN`` lines run, and then the image's ``CMD`` (the
code server) starts with the code service's environment from ``deploy/docker-compose.yaml`` and
must serve the project's code location from the copy the image installed.

What it cannot prove, and how each step is stood in for:

* ``FROM python:3.12-slim``: the image's Python is a fresh venv of this suite's interpreter
  (3.11, which ``requires-python`` allows). Its base packages are this suite's venv (a ``.pth``
  line), so the ``pip install`` line resolves the dependencies against installed versions
  instead of downloading them (a download of every dependency would cost minutes; it is what
  the registry gives any ``pip install``). The project itself builds (PEP 517, with its build
  dependencies fetched as in the image) and installs into the venv, non-editable, from the
  copied files only.
* ``pip`` and ``dagster``, run by name in the image, run as ``<venv python> -m pip`` and
  ``-m dagster``: the venv has the project's scripts, its dependencies' scripts stay in the
  suite's venv.
* Absolute paths (``/opt/...``, ``/data``) in ``WORKDIR``, ``COPY``, ``ENV``, ``RUN`` and the
  compose file's environment point into the temporary root.
* ``useradd``/``chown`` and ``USER`` need root and change the machine's accounts: they are not
  run (the test names them); the processes run as the suite's user. Any other command in a
  ``RUN`` line fails the test until it is carried out or named here.
* The code server binds 127.0.0.1 and a free port instead of ``0.0.0.0:4000``.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import dockerfile
import pytest
import yaml
from docker.utils.build import exclude_paths

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster_tests.postgres import running_postgres
from fieldsales_dagster_tests.processes import process_group, tail
from fieldsales_dagster_tests.project import load_project_defs

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "docker-compose.yaml"
#: Commands of RUN lines that need root and alter the machine's accounts: named, not run.
NOT_RUN = {"useradd", "chown"}
#: A guard against a hang (the install and the code server's first load), not a timing.
DEADLINE_S = 300.0


def steps() -> tuple[dockerfile.Command, ...]:
    return dockerfile.parse_file(str(ROOT / "Dockerfile"))


def compose_services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def image_cmd() -> list[str]:
    (cmd,) = [step for step in steps() if step.cmd == "CMD"]
    assert cmd.json, "CMD in exec form: the process gets the signals, not a shell"
    return list(cmd.value)


# --- parsed ------------------------------------------------------------------------------------


def test_dockerfile_copies_what_exists_and_installs_as_the_guide_does():
    parsed = steps()
    copied = [source for step in parsed if step.cmd == "COPY" for source in step.value[:-1]]
    assert copied and all((ROOT / source).exists() for source in copied), copied
    # Everything pip needs to build the package: its metadata, its readme, its code.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"pyproject.toml", project["readme"], "fieldsales_dagster"} <= set(copied)
    installs = [step.value[0] for step in parsed if step.cmd == "RUN" and "pip" in step.value[0]]
    assert installs == ["pip install --no-cache-dir '.[production]'"]
    # ... the guide's install line, without -e (an image holds a fixed copy).
    guide = (ROOT / "deploy" / "README.md").read_text()
    assert ".venv/bin/pip install -e '.[production]'" in guide
    env = dict(pair for step in parsed if step.cmd == "ENV" for pair in env_pairs(step))
    assert any(
        step.cmd == "COPY" and step.value[-1] == f"{env['DAGSTER_HOME']}/dagster.yaml"
        for step in parsed
    )


def test_the_data_volume_comment_names_what_the_guide_puts_there():
    """The Dockerfile's comment on /data names the variables whose files the guide puts on the
    data volume: the lake's catalog first (no "DuckDB files" of an earlier release)."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "mkdir -p /data" in line)
    above = itertools.takewhile(lambda line: line.startswith("#"), reversed(lines[:at]))
    comment = " ".join(reversed(list(above)))
    guide = (ROOT / "deploy" / "README.md").read_text()
    on_volume = re.findall(r"^\| `(FIELDSALES_\w+)` \|[^\n]*/data/", guide, re.M)
    assert on_volume and set(re.findall(r"FIELDSALES_\w+", comment)) == set(on_volume)
    assert "lake" in comment


def env_pairs(step: dockerfile.Command) -> list[tuple[str, str]]:
    """``ENV A=1 B=2``: the parser gives the names and values in turn."""
    return list(zip(step.value[::2], step.value[1::2], strict=True))


def test_compose_file_runs_the_four_processes_from_the_image():
    services = compose_services()
    # The default layout; the object store is an option (`--profile s3`), sharing code's network.
    profiles = {name: tuple(spec.get("profiles", ())) for name, spec in services.items()}
    assert {name for name, p in profiles.items() if not p} == {
        "postgres",
        "code",
        "webserver",
        "daemon",
    }
    assert {name: p for name, p in profiles.items() if p} == {
        "minio": ("s3",),
        "minio-setup": ("s3",),
    }
    assert {services[n]["network_mode"] for n in ("minio", "minio-setup")} == {"service:code"}
    build = services["code"]["build"]
    assert (ROOT / "deploy" / build["context"] / build["dockerfile"]).resolve() == (
        ROOT / "Dockerfile"
    )
    image = services["code"]["image"]
    assert services["webserver"]["image"] == services["daemon"]["image"] == image
    # The code service runs the image's CMD; the others give their own command.
    assert "command" not in services["code"]
    commands = {
        "code": image_cmd(),
        **{name: services[name]["command"] for name in ("webserver", "daemon")},
    }
    assert commands["code"][:3] == ["dagster", "code-server", "start"]
    assert commands["webserver"][0] == "dagster-webserver"
    assert commands["daemon"][:2] == ["dagster-daemon", "run"]
    # The webserver and the daemon read the code server through the workspace the image holds.
    workspace = yaml.safe_load((ROOT / "deploy" / "workspace.docker.yaml").read_text())
    (server,) = [entry["grpc_server"] for entry in workspace["load_from"]]
    assert server["host"] == "code" and str(server["port"]) in commands["code"]
    assert (
        commands["webserver"][-1]
        == commands["daemon"][-1]
        == "/opt/fieldsales/workspace.docker.yaml"
    )
    assert any(
        step.cmd == "COPY" and step.value[-1] == "/opt/fieldsales/workspace.docker.yaml"
        for step in steps()
    )
    # The UI has no authentication: published on the host's loopback only.
    assert services["webserver"]["ports"] == ["127.0.0.1:3000:3000"]
    # The code server runs the runs and the sensors: it holds the data volume and the settings.
    assert "fieldsales-data:/data" in services["code"]["volumes"]
    code_env = services["code"]["environment"]
    assert code_env["FIELDSALES_DUCKDB_PATH"] == "/data/fieldsales.duckdb"
    assert code_env["FIELDSALES_TOKEN_STORE"] == "/data/fieldsales_token.json"
    assert "@postgres:5432/dagster" in code_env["DAGSTER_POSTGRES_URL"]
    # The deploy guide uses it.
    assert "docker compose -f deploy/docker-compose.yaml up" in (
        (ROOT / "deploy" / "README.md").read_text()
    )


# --- built -------------------------------------------------------------------------------------


class ImageRoot:
    """A folder standing for the image's file system: absolute paths of the image point into it."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, image_path: str, workdir: str = "/") -> Path:
        absolute = os.path.normpath(os.path.join(workdir, image_path))
        return self.root / absolute.lstrip("/")

    def value(self, text: str) -> str:
        """An argument or variable: an absolute path points into the root, the rest stays."""
        return str(self.path(text)) if text.startswith("/") else text


def interpolate(value: str, given: dict[str, str]) -> str:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?message}``."""

    def one(match: re.Match) -> str:
        name, kind, rest = match["name"], match["kind"], match["rest"]
        if name in given:
            return given[name]
        assert kind == ":-", f"{name} must be given: {rest}"
        return rest

    return re.sub(r"\$\{(?P<name>\w+)(?:(?P<kind>:[-?])(?P<rest>[^}]*))?\}", one, str(value))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_python(venv: Path) -> Path:
    """The image's Python: a fresh venv whose base packages are this suite's (see the top)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "suite_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_dockerfile_builds_and_its_cmd_serves_the_installed_code_location(tmp_path):
    image = ImageRoot(tmp_path / "image")
    image.root.mkdir()
    python = make_python(tmp_path / "python")
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    context = set(exclude_paths(str(ROOT), ignored, dockerfile="Dockerfile"))
    env = {
        "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }

    def program(argv: list[str]) -> list[str]:
        """``pip``/``dagster`` by name, as the image's PATH finds them (see the top)."""
        if argv[0] in ("pip", "dagster"):
            return [str(python), "-m", argv[0], *argv[1:]]
        return argv

    workdir, not_run, cmd = "/", [], None
    for step in steps():
        if step.cmd == "FROM":
            assert step.value[0].startswith("python:3."), step.original
        elif step.cmd == "WORKDIR":
            workdir = os.path.join(workdir, step.value[0])
            image.path(workdir).mkdir(parents=True, exist_ok=True)
        elif step.cmd == "COPY":
            *sources, target = step.value
            for source in sources:
                assert source in context, f"{step.original}: {source} is not in the context"
                into = image.path(target, workdir)
                if target.endswith("/"):
                    into = into / Path(source).name
                into.parent.mkdir(parents=True, exist_ok=True)
                if (ROOT / source).is_dir():
                    for relative in sorted(context):
                        if relative.startswith(f"{source}/") and (ROOT / relative).is_file():
                            copied = into / Path(relative).relative_to(source)
                            copied.parent.mkdir(parents=True, exist_ok=True)
                            shutil.copy2(ROOT / relative, copied)
                else:
                    shutil.copy2(ROOT / source, into)
        elif step.cmd == "ENV":
            for name, value in env_pairs(step):
                env[name] = image.value(value)
        elif step.cmd == "RUN":
            for command in step.value[0].split("&&"):
                argv = shlex.split(command)
                if argv[0] in NOT_RUN:
                    not_run.append(argv[0])
                    continue
                assert argv[0] in ("pip", "mkdir"), f"{step.original}: {argv[0]} is not carried out"
                done = subprocess.run(
                    program([argv[0], *(image.value(arg) for arg in argv[1:])]),
                    cwd=image.path(workdir),
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=DEADLINE_S,
                )
                assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}{done.stderr}"
        elif step.cmd == "USER":
            not_run.append("USER")
        elif step.cmd == "CMD":
            cmd = list(step.value)
        else:
            pytest.fail(f"{step.original}: not carried out by this test")
    assert sorted(set(not_run)) == ["USER", "chown", "useradd"]

    # The project is installed into the image's Python, not linked to this repository.
    installed = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; print(u.find_spec('fieldsales_dagster').origin)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(installed).is_relative_to(python.parent.parent), installed
    # The instance and the workspace the Dockerfile puts in place, as in the repository.
    home = Path(env["DAGSTER_HOME"])
    assert (home / "dagster.yaml").read_text() == (ROOT / "deploy" / "dagster.yaml").read_text()

    # The image's CMD, with the code service's environment from the compose file: its instance
    # is the compose file's PostgreSQL (a real one here, set up as the postgres image does from
    # POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB), its API the demo API.
    port = free_port()
    assert cmd is not None
    argv = ["127.0.0.1" if a == "0.0.0.0" else str(port) if a == "4000" else a for a in cmd]
    with (
        running_postgres(database=None) as admin,
        DemoServer(DemoConfig(transactions=50, seed=1), host="127.0.0.1", port=0) as api,
    ):
        given = {
            "POSTGRES_PASSWORD": "image-test",
            "FIELDSALES_BASE_URL": api.base_url,
            "FIELDSALES_API_TOKEN": api.token,
        }
        services = compose_services()
        postgres = {
            k: interpolate(v, given) for k, v in services["postgres"]["environment"].items()
        }
        conn = admin.connect()
        conn.autocommit = True  # CREATE DATABASE runs outside a transaction
        try:
            with conn.cursor() as cur:
                user = postgres["POSTGRES_USER"]
                cur.execute(
                    f"CREATE ROLE {user} LOGIN PASSWORD %s", (postgres["POSTGRES_PASSWORD"],)
                )
                cur.execute(f"CREATE DATABASE {postgres['POSTGRES_DB']} OWNER {user}")
        finally:
            conn.close()
        service_env = {
            name: image.value(
                interpolate(value, given).replace("@postgres:5432/", f"@127.0.0.1:{admin.port}/")
            )
            for name, value in services["code"]["environment"].items()
        }
        log = tmp_path / "code_server.log"
        with process_group(program(argv), log, {**env, **service_env}, cwd=image.path(workdir)):
            repository = wait_for_repository(port, log)
        # The same assets as the definitions from this repository ...
        # (with the compose file's single-file export, as the image's code server has it)
        os.environ.update(
            FIELDSALES_BASE_URL=api.base_url,
            FIELDSALES_API_TOKEN=api.token,
            FIELDSALES_DUCKDB_PATH=str(tmp_path / "export.duckdb"),
        )
        try:
            expected = load_project_defs().resolve_all_asset_keys()
        finally:
            for name in ("FIELDSALES_BASE_URL", "FIELDSALES_API_TOKEN", "FIELDSALES_DUCKDB_PATH"):
                os.environ.pop(name)
    nodes = repository.get_asset_node_snaps()
    assert {node.asset_key for node in nodes if node.is_materializable} == set(expected)
    # ... served from the copy the image installed (the assets' source code references).
    sources = {
        reference.file_path
        for node in nodes
        for reference in getattr(
            node.metadata.get("dagster/code_references"), "code_references", []
        )
    }
    assert sources, "no code references to check where the code came from"
    outside = [s for s in sources if not Path(s).is_relative_to(tmp_path)]
    assert not outside, f"served from outside the image's root: {outside[:3]}"


def wait_for_repository(port: int, log: Path):
    """The code server's repository, once it answers (its first load imports the project)."""
    from dagster import DagsterInstance
    from dagster._core.errors import DagsterUserCodeUnreachableError
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin
    from dagster._core.remote_representation.code_location import GrpcServerCodeLocation

    origin = GrpcServerCodeLocationOrigin(
        host="127.0.0.1", port=port, location_name="fieldsales_dagster"
    )
    deadline = time.monotonic() + DEADLINE_S
    last = None
    with DagsterInstance.ephemeral() as instance:
        while time.monotonic() < deadline:
            try:
                with GrpcServerCodeLocation(origin, instance=instance) as location:
                    (repository,) = location.get_repositories().values()
                    return repository
            except DagsterUserCodeUnreachableError as exc:  # not listening yet
                last = exc
                time.sleep(1)
            except Exception as exc:
                pytest.fail(f"the code server failed to serve its location: {exc}\n{tail(log)}")
    pytest.fail(f"the code server did not answer: {last}\n{tail(log)}")
