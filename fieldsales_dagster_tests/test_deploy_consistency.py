"""deploy/: the compose file and the two run launchers name the same things.

No container engine runs here, so nothing is started: the files are parsed, the names Compose
will create are resolved as Compose resolves them (a network or volume is ``<project>_<key>``
unless it has a ``name:``; the project is the top-level ``name:``, else the compose file's
folder), and every network, volume, image and environment variable that one file names must be
defined by the other. ``deploy_problems`` lists each disagreement in words; the tests below run
it on the files as they stand (no problem) and on parsed copies broken on purpose (each reported).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import dockerfile
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yaml"


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / name).read_text())


def project_name(compose: dict[str, Any]) -> str:
    """Compose's project: the top-level ``name:``, else the compose file's folder."""
    return compose.get("name") or COMPOSE.parent.name


def resolved(compose: dict[str, Any], kind: str) -> dict[str, str]:
    """Top-level ``networks``/``volumes``: key -> the name Compose gives the object."""
    names = {}
    for key, spec in (compose.get(kind) or {}).items():
        spec = spec or {}
        if spec.get("name"):
            names[key] = spec["name"]
        elif spec.get("external"):
            names[key] = key
        else:
            names[key] = f"{project_name(compose)}_{key}"
    return names


def service_networks(compose: dict[str, Any], service: str) -> set[str]:
    """The resolved networks a service joins (none listed: the project's ``default``)."""
    listed = compose["services"][service].get("networks") or ["default"]
    keys = resolved(compose, "networks")
    return {keys.get(key, f"{project_name(compose)}_{key}") for key in listed}


def service_mounts(compose: dict[str, Any], service: str) -> dict[str, str]:
    """A service's named-volume mounts: resolved volume name -> path in the container."""
    keys = resolved(compose, "volumes")
    mounts = {}
    for entry in compose["services"][service].get("volumes") or []:
        source, target = entry.split(":")[:2]
        if source in keys:
            mounts[keys[source]] = target
    return mounts


def env_names(entries: list[str]) -> dict[str, str | None]:
    """A launcher's ``env_vars``: ``NAME`` (from the daemon) or ``NAME=value`` (given)."""
    return {
        entry.split("=", 1)[0]: (entry.split("=", 1)[1] if "=" in entry else None)
        for entry in entries
    }


def comment_variables(text: str, key: str) -> set[str]:
    """The variables the comment line(s) just above ``key:`` name."""
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip() == f"{key}:"]
    names: set[str] = set()
    i = at - 1
    while i >= 0 and lines[i].strip().startswith("#"):
        names |= set(re.findall(r"\b(?:FIELDSALES|DAGSTER|MALLOC)_[A-Z_]+\b", lines[i]))
        i -= 1
    return names


def image_env() -> dict[str, str]:
    env = {}
    for step in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if step.cmd == "ENV":
            env.update(zip(step.value[::2], step.value[1::2], strict=True))
    return env


def deploy_problems(
    compose: dict[str, Any],
    docker: dict[str, Any],
    k8s: dict[str, Any],
    k8s_text: str,
    workspace: dict[str, Any],
) -> list[str]:
    """Every name one deploy file uses that the other does not define, in words."""
    problems = []
    services = compose["services"]
    # Compose creates the networks declared and, for a service that lists none, "default".
    networks = set(resolved(compose, "networks").values()).union(
        *(service_networks(compose, service) for service in services)
    )
    volumes = set(resolved(compose, "volumes").values())
    config = docker["run_launcher"]["config"]
    code_env = services["code"]["environment"]
    daemon_env = services["daemon"]["environment"]

    # Network: run containers join it and must reach PostgreSQL (DAGSTER_POSTGRES_URL's host).
    network = config["network"]
    if network not in networks:
        problems.append(
            f"run_launcher.docker.yaml: network {network!r} is not a network the compose file "
            f"creates (it creates {sorted(networks)})"
        )
    elif network not in service_networks(compose, "postgres"):
        problems.append(f"docker-compose.yaml: postgres does not join network {network!r}")

    # Volumes: a run container mounts what the code server (the default launcher's runs) mounts.
    code_mounts = service_mounts(compose, "code")
    for entry in config.get("container_kwargs", {}).get("volumes", []):
        source, target = entry.split(":")[:2]
        if source not in volumes:
            problems.append(
                f"run_launcher.docker.yaml: volume {source!r} is not a volume the compose file "
                f"creates (it creates {sorted(volumes)})"
            )
        elif code_mounts.get(source) != target:
            problems.append(
                f"run_launcher.docker.yaml mounts {source!r} at {target}; the code service at "
                f"{code_mounts.get(source)}"
            )

    # Image: the launcher names none, so the code server must report its own image.
    image = config.get("image") or code_env.get("DAGSTER_CURRENT_IMAGE")
    if image is None:
        problems.append(
            "docker-compose.yaml: the code service does not set DAGSTER_CURRENT_IMAGE, and "
            "run_launcher.docker.yaml names no image"
        )
    elif image != services["code"]["image"]:
        problems.append(
            f"run containers would start from image {image!r}; the compose file builds "
            f"{services['code']['image']!r}"
        )

    # Environment: the launcher passes the daemon's variables on; a run needs what the code
    # server (where runs start by default) has, bar the image the launcher itself applies.
    passed = env_names(config.get("env_vars", []))
    for name, value in passed.items():
        if value is None and name not in daemon_env:
            problems.append(
                f"run_launcher.docker.yaml passes {name} from the daemon, whose compose "
                "environment does not define it"
            )
        if value is not None and name in code_env and str(code_env[name]) != value:
            problems.append(f"{name} is {value!r} in run containers, {code_env[name]!r} in code")
    needed = set(code_env) - {"DAGSTER_CURRENT_IMAGE"}
    for name in sorted(needed - set(passed)):
        problems.append(
            f"run_launcher.docker.yaml does not pass {name}, which the code service has"
        )

    # Kubernetes: the same variables reach run pods through the ConfigMap and the Secret.
    k8s_config = k8s["run_launcher"]["config"]
    in_k8s = comment_variables(k8s_text, "env_config_maps") | comment_variables(
        k8s_text, "env_secrets"
    )
    for name in sorted(set(passed) - in_k8s):
        problems.append(f"run_launcher.k8s.yaml names no ConfigMap or Secret holding {name}")
    claims = {volume["name"] for volume in k8s_config.get("volumes", [])}
    for mount in k8s_config.get("volume_mounts", []):
        if mount["name"] not in claims:
            problems.append(f"run_launcher.k8s.yaml mounts {mount['name']!r}, no volume of its")
        if mount["mountPath"] not in code_mounts.values():
            problems.append(
                f"run_launcher.k8s.yaml mounts the data at {mount['mountPath']}; the compose "
                f"file and FIELDSALES_DUCKDB_PATH use {sorted(code_mounts.values())}"
            )
    if k8s_config["dagster_home"] != image_env().get("DAGSTER_HOME"):
        problems.append(
            f"run_launcher.k8s.yaml: dagster_home {k8s_config['dagster_home']} is not the "
            f"image's DAGSTER_HOME {image_env().get('DAGSTER_HOME')}"
        )

    # The data paths of the environment lie on the mounted volume.
    for name in ("FIELDSALES_DUCKDB_PATH", "FIELDSALES_TOKEN_STORE"):
        if not any(str(code_env.get(name, "")).startswith(f"{t}/") for t in code_mounts.values()):
            problems.append(f"docker-compose.yaml: {name} is not on the data volume")

    # The webserver and the daemon reach the code server named in the workspace.
    for entry in workspace["load_from"]:
        host = entry["grpc_server"]["host"]
        if host not in services:
            problems.append(f"workspace.docker.yaml: host {host!r} is no compose service")
            continue
        for client in ("webserver", "daemon"):
            if not service_networks(compose, client) & service_networks(compose, host):
                problems.append(f"docker-compose.yaml: {client} shares no network with {host}")
    return problems


@pytest.fixture
def files() -> dict[str, Any]:
    return {
        "compose": load("docker-compose.yaml"),
        "docker": load("run_launcher.docker.yaml"),
        "k8s": load("run_launcher.k8s.yaml"),
        "k8s_text": (DEPLOY / "run_launcher.k8s.yaml").read_text(),
        "workspace": load("workspace.docker.yaml"),
    }


def test_the_deploy_files_agree(files):
    assert deploy_problems(**files) == []


def test_compose_creates_the_launchers_network_and_volume_under_their_own_names(files):
    compose = files["compose"]
    assert compose["name"] == "fieldsales"
    assert resolved(compose, "networks")["fieldsales"] == "fieldsales"
    assert resolved(compose, "volumes")["fieldsales-data"] == "fieldsales-data"
    assert compose["services"]["code"]["environment"]["DAGSTER_CURRENT_IMAGE"] == (
        "fieldsales-dagster"
    )


def test_a_renamed_network_is_reported(files):
    broken = copy.deepcopy(files)
    broken["compose"]["networks"]["fieldsales"]["name"] = "fieldsales-net"
    (problem,) = deploy_problems(**broken)
    assert "network 'fieldsales' is not a network the compose file creates" in problem
    assert "fieldsales-net" in problem


def test_compose_prefixes_unnamed_objects_with_the_project_and_the_check_sees_it(files):
    # The compose file as it was: no top-level name, no explicit names, the default network.
    broken = copy.deepcopy(files)
    compose = broken["compose"]
    del compose["name"]
    compose["networks"] = None
    compose["volumes"] = {"postgres-data": None, "fieldsales-data": None}
    for service in compose["services"].values():
        service.pop("networks", None)
    problems = deploy_problems(**broken)
    assert any("'deploy_default'" in p and "network 'fieldsales'" in p for p in problems)
    assert any("volume 'fieldsales-data'" in p and "deploy_fieldsales-data" in p for p in problems)


def test_a_missing_image_or_variable_is_reported(files):
    broken = copy.deepcopy(files)
    del broken["compose"]["services"]["code"]["environment"]["DAGSTER_CURRENT_IMAGE"]
    daemon = dict(broken["compose"]["services"]["daemon"]["environment"])
    del daemon["FIELDSALES_TOKEN_STORE"]
    broken["compose"]["services"]["daemon"]["environment"] = daemon
    broken["docker"]["run_launcher"]["config"]["env_vars"].remove("FIELDSALES_SCHEDULE_CRON")
    problems = deploy_problems(**broken)
    assert any("does not set DAGSTER_CURRENT_IMAGE" in p for p in problems)
    assert any("passes FIELDSALES_TOKEN_STORE from the daemon" in p for p in problems)
    assert any("does not pass FIELDSALES_SCHEDULE_CRON" in p for p in problems)
    assert len(problems) == 3, problems


def test_a_k8s_variable_or_mount_that_disagrees_is_reported(files):
    broken = copy.deepcopy(files)
    broken["k8s_text"] = broken["k8s_text"].replace("FIELDSALES_TOKEN_STORE, ", "")
    broken["k8s"]["run_launcher"]["config"]["volume_mounts"][0]["mountPath"] = "/srv/data"
    problems = deploy_problems(**broken)
    assert any("holding FIELDSALES_TOKEN_STORE" in p for p in problems)
    assert any("mounts the data at /srv/data" in p for p in problems)
    assert len(problems) == 2, problems


def test_the_guide_names_the_kubernetes_objects_the_launcher_uses(files):
    config = files["k8s"]["run_launcher"]["config"]
    guide = (DEPLOY / "README.md").read_text()
    section = guide.split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    names = [
        config["instance_config_map"],
        config["job_namespace"],
        *config["env_config_maps"],
        *config["env_secrets"],
        *(volume["persistentVolumeClaim"]["claimName"] for volume in config["volumes"]),
    ]
    assert [name for name in names if f"`{name}`" not in section] == []
