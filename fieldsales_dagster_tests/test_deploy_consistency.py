"""deploy/: the compose file, the two run launchers and the Helm values name the same things.

No container engine runs here, so nothing is started: the files are parsed, the names Compose
will create are resolved as Compose resolves them (a network or volume is ``<project>_<key>``
unless it has a ``name:``; the project is the top-level ``name:``, else the compose file's
folder), and every network, volume, image and environment variable that one file names must be
defined by the other. What a run reads comes from one place, the component's ``requirements:
env:`` in defs.yaml (and the object store's variables): each launcher passes all of it, or names
each variable it leaves out with its reason. ``deploy_problems`` lists each disagreement in
words; the tests below run it on the files as they stand (no problem) and on parsed copies broken
on purpose (each reported).
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import dockerfile
import pytest
import yaml

from fieldsales_dagster_tests.test_docker_image import image_cmd

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yaml"
DEFS = ROOT / "fieldsales_dagster" / "defs" / "fieldsales" / "defs.yaml"
#: The object store's variables: the lake's settings, and the standard AWS ones that also work.
OBJECT_STORE = {
    *("FIELDSALES_S3_ENDPOINT", "FIELDSALES_S3_REGION", "FIELDSALES_S3_URL_STYLE"),
    *("FIELDSALES_S3_ACCESS_KEY_ID", "FIELDSALES_S3_SECRET_ACCESS_KEY"),
    *("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    *("AWS_REGION", "AWS_ENDPOINT_URL"),
}
#: A variable holding a secret, by its name (the token, passwords, keys, the webhook's URL).
SECRET = re.compile(r"(TOKEN|PASSWORD|_KEY|_KEY_ID|WEBHOOK_URL|POSTGRES_URL)$")
#: A comment line of a launcher naming a variable it leaves out: ``#   NAME: why``.
LEFT_OUT = re.compile(r"^\s*#\s+([A-Z][A-Z0-9_]+): (\S.*)$")
#: The instance's settings the Helm values give the chart (in camelCase) for its dagster.yaml;
#: the chart writes the first two only when their ``enabled`` is true.
CHART_INSTANCE_KEYS = (
    *("concurrency", "retention", "run_monitoring", "run_retries", "schedules", "sensors"),
    "telemetry",
)


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
    """The resolved networks a service joins (none listed: the project's ``default``; with
    ``network_mode: service:<other>``, the other's)."""
    spec = compose["services"][service]
    if str(spec.get("network_mode", "")).startswith("service:"):
        return service_networks(compose, spec["network_mode"].removeprefix("service:"))
    listed = spec.get("networks") or ["default"]
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
    """The variables the comment line(s) just above ``key:`` name (bar those left out)."""
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip() == f"{key}:"]
    names: set[str] = set()
    i = at - 1
    while i >= 0 and lines[i].strip().startswith("#"):
        if not LEFT_OUT.match(lines[i]):
            names |= set(re.findall(r"\b(?:FIELDSALES|DAGSTER|MALLOC|AWS)_[A-Z0-9_]+\b", lines[i]))
        i -= 1
    return names


def run_variables() -> set[str]:
    """What a run reads: the component's ``requirements: env:`` and the object store's."""
    return {*yaml.safe_load(DEFS.read_text())["requirements"]["env"], *OBJECT_STORE}


def unpassed(name: str, text: str, passed: set[str], needed: set[str]) -> list[str]:
    """A launcher's gaps: each of the ``needed`` variables it neither passes nor leaves out with a
    reason in its comments (``#   NAME: why``), and each it leaves out but passes or must pass."""
    left_out = {m[1] for m in map(LEFT_OUT.match, text.splitlines()) if m}
    return [
        *(f"{name} does not pass {v} nor says why" for v in sorted(needed - passed - left_out)),
        *(f"{name} passes {v} and leaves it out" for v in sorted(passed & left_out)),
        *(
            f"{name} leaves out {v}, not a variable it may leave out"
            for v in sorted(left_out - needed)
        ),
    ]


def snake(value: Any) -> Any:
    """The chart's camelCase keys as dagster.yaml spells them."""
    if isinstance(value, dict):
        return {re.sub(r"([A-Z])", r"_\1", k).lower(): snake(v) for k, v in value.items()}
    return [snake(v) for v in value] if isinstance(value, list) else value


def image_env() -> dict[str, str]:
    env = {}
    for step in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if step.cmd == "ENV":
            env.update(zip(step.value[::2], step.value[1::2], strict=True))
    return env


def helm_problems(helm: dict[str, Any], helm_text: str, code_image: str) -> list[str]:
    """The Helm values against the image, the workspace, deploy/dagster.yaml and what a run
    reads, for the layout without a shared disk."""
    problems = []
    (deployment,) = helm["dagster-user-deployments"]["deployments"]
    env = {entry["name"]: entry for entry in deployment.get("env") or []}
    value = {name: str(entry.get("value", "")) for name, entry in env.items()}

    # Every variable a run reads: the code server has it, and its run pods get its env.
    problems += unpassed("helm-values.yaml", helm_text, set(env), run_variables())
    if not deployment.get("includeConfigInLaunchedRuns", {}).get("enabled"):
        problems.append(
            "helm-values.yaml: the run pods do not get the code server's env "
            "(includeConfigInLaunchedRuns.enabled)"
        )

    # Secrets from a Secret, never a value in the file.
    for name in sorted(n for n, entry in env.items() if SECRET.search(n) and "value" in entry):
        problems.append(f"helm-values.yaml gives {name} a value; take it from a Secret")
    postgres = helm["postgresql"]
    if postgres.get("postgresqlPassword") or helm.get("generatePostgresqlPasswordSecret", True):
        problems.append(
            "helm-values.yaml: Dagster's PostgreSQL password is a value, not the Secret "
            "global.postgresqlSecretName"
        )

    # The image, its command and the module: the Dockerfile's CMD, the workspace's module.
    if deployment["image"]["repository"].rsplit("/", 1)[-1] != code_image:
        problems.append(
            f"helm-values.yaml: image {deployment['image']['repository']} is not the compose "
            f"file's {code_image}"
        )
    command = ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", str(deployment["port"])]
    command += deployment.get("codeServerArgs") or []
    if command != image_cmd():
        problems.append(
            f"helm-values.yaml starts `{shlex.join(command)}`; the image's CMD is "
            f"`{shlex.join(image_cmd())}`"
        )
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    modules = {entry["python_module"]["module_name"] for entry in workspace["load_from"]}
    if not modules <= set(command):
        problems.append(f"helm-values.yaml does not load {sorted(modules)} (workspace.yaml)")

    # No shared disk: the lake's files in an object store, the token in the catalog, no volume.
    if not value.get("FIELDSALES_DUCKLAKE_DATA_PATH", "").startswith("s3://"):
        problems.append("helm-values.yaml: FIELDSALES_DUCKLAKE_DATA_PATH is not s3://...")
    if value.get("FIELDSALES_TOKEN_STORE") != "catalog":
        problems.append("helm-values.yaml: FIELDSALES_TOKEN_STORE is not catalog")
    if value.get("FIELDSALES_DUCKDB_PATH"):
        problems.append("helm-values.yaml: FIELDSALES_DUCKDB_PATH would be a run pod's own disk")
    launcher = helm["runLauncher"]["config"]["k8sRunLauncher"]
    for holder, spec in (("the code server", deployment), ("the run launcher", launcher)):
        for key in ("volumes", "volumeMounts"):
            if spec.get(key):
                problems.append(f"helm-values.yaml: {holder} has {key}, which nothing needs")

    # The queue, the pools and the retries of deploy/dagster.yaml.
    instance = load("dagster.yaml")
    for key in CHART_INSTANCE_KEYS:
        camel = re.sub(r"_(\w)", lambda m: m[1].upper(), key)
        chart = snake(helm.get(camel) or helm["dagsterDaemon"].get(camel) or {})
        if key in CHART_INSTANCE_KEYS[:2] and chart.pop("enabled", False) is not True:
            problems.append(f"helm-values.yaml does not enable {camel}")
        if chart != instance[key]:
            problems.append(
                f"helm-values.yaml's {camel} is {chart}; deploy/dagster.yaml's {key} is "
                f"{instance[key]}"
            )
    return problems


def deploy_problems(
    compose: dict[str, Any],
    docker: dict[str, Any],
    docker_text: str,
    k8s: dict[str, Any],
    k8s_text: str,
    workspace: dict[str, Any],
    helm: dict[str, Any],
    helm_text: str,
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
    problems += unpassed(
        "run_launcher.docker.yaml", docker_text, set(passed), run_variables() - needed
    )

    # Kubernetes: the same variables reach run pods through the ConfigMap and the Secret.
    k8s_config = k8s["run_launcher"]["config"]
    in_k8s = comment_variables(k8s_text, "env_config_maps") | comment_variables(
        k8s_text, "env_secrets"
    )
    for name in sorted(set(passed) - in_k8s):
        problems.append(f"run_launcher.k8s.yaml names no ConfigMap or Secret holding {name}")
    problems += unpassed("run_launcher.k8s.yaml", k8s_text, in_k8s, run_variables() - set(passed))

    # Secrets: from the operator's environment in Compose, from the Secret on Kubernetes.
    for name, value in services["code"]["environment"].items():
        if SECRET.search(name) and "${" not in str(value):
            problems.append(f"docker-compose.yaml writes {name}; take it from the environment")
    for name in sorted(filter(SECRET.search, comment_variables(k8s_text, "env_config_maps"))):
        problems.append(f"run_launcher.k8s.yaml puts {name} in the ConfigMap, not the Secret")
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
    return problems + helm_problems(helm, helm_text, services["code"]["image"])


@pytest.fixture
def files() -> dict[str, Any]:
    return {
        "compose": load("docker-compose.yaml"),
        "docker": load("run_launcher.docker.yaml"),
        "docker_text": (DEPLOY / "run_launcher.docker.yaml").read_text(),
        "k8s": load("run_launcher.k8s.yaml"),
        "k8s_text": (DEPLOY / "run_launcher.k8s.yaml").read_text(),
        "workspace": load("workspace.docker.yaml"),
        "helm": load("helm-values.yaml"),
        "helm_text": (DEPLOY / "helm-values.yaml").read_text(),
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


def test_a_secret_written_into_a_deploy_file_is_reported(files):
    broken = copy.deepcopy(files)
    broken["compose"]["services"]["code"]["environment"]["FIELDSALES_DUCKLAKE_PASSWORD"] = "pw"
    broken["k8s_text"] = broken["k8s_text"].replace(
        "# FIELDSALES_PAGE_SIZE,", "# FIELDSALES_PAGE_SIZE, FIELDSALES_PII_HASH_KEY,"
    )
    assert deploy_problems(**broken) == [
        "docker-compose.yaml writes FIELDSALES_DUCKLAKE_PASSWORD; take it from the environment",
        "run_launcher.k8s.yaml puts FIELDSALES_PII_HASH_KEY in the ConfigMap, not the Secret",
    ]


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


def helm_env(broken: dict[str, Any]) -> list[dict[str, Any]]:
    return broken["helm"]["dagster-user-deployments"]["deployments"][0]["env"]


def test_every_launcher_passes_what_a_run_reads_or_says_why_not(files, monkeypatch):
    # A variable the component starts reading: every launcher that does not pass it is named.
    monkeypatch.setattr(f"{__name__}.OBJECT_STORE", OBJECT_STORE | {"FIELDSALES_S3_SOMETHING_NEW"})
    assert sorted(deploy_problems(**files)) == [
        f"{name} does not pass FIELDSALES_S3_SOMETHING_NEW nor says why"
        for name in ("helm-values.yaml", "run_launcher.docker.yaml", "run_launcher.k8s.yaml")
    ]


def test_a_variable_left_out_without_reason_or_passed_anyway_is_reported(files):
    broken = copy.deepcopy(files)
    broken["docker_text"] = re.sub(r"\n *# *AWS_REGION: .*", "", broken["docker_text"])
    broken["helm_text"] = broken["helm_text"].replace("#   AWS_SESSION_TOKEN:", "#   AWS_TOKEN:")
    helm_env(broken).append({"name": "AWS_REGION", "value": "eu-central-1"})
    assert deploy_problems(**broken) == [
        "run_launcher.docker.yaml does not pass AWS_REGION nor says why",
        "helm-values.yaml does not pass AWS_SESSION_TOKEN nor says why",
        "helm-values.yaml passes AWS_REGION and leaves it out",
        "helm-values.yaml leaves out AWS_TOKEN, not a variable it may leave out",
    ]


def test_helm_values_that_write_a_secret_or_need_a_shared_disk_are_reported(files):
    broken = copy.deepcopy(files)
    env = helm_env(broken)
    (token,) = [entry for entry in env if entry["name"] == "FIELDSALES_API_TOKEN"]
    token.pop("valueFrom")
    token["value"] = "a-literal-token"
    broken["helm"]["postgresql"]["postgresqlPassword"] = "a-literal-password"
    values = {entry["name"]: entry for entry in env}
    values["FIELDSALES_DUCKLAKE_DATA_PATH"]["value"] = "/data/lake"
    values["FIELDSALES_TOKEN_STORE"]["value"] = "/data/fieldsales_token.json"
    values["FIELDSALES_DUCKDB_PATH"]["value"] = "/data/fieldsales.duckdb"
    deployment = broken["helm"]["dagster-user-deployments"]["deployments"][0]
    deployment["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    deployment["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    deployment["includeConfigInLaunchedRuns"]["enabled"] = False
    assert deploy_problems(**broken) == [
        "helm-values.yaml: the run pods do not get the code server's env "
        "(includeConfigInLaunchedRuns.enabled)",
        "helm-values.yaml gives FIELDSALES_API_TOKEN a value; take it from a Secret",
        "helm-values.yaml: Dagster's PostgreSQL password is a value, not the Secret "
        "global.postgresqlSecretName",
        "helm-values.yaml: FIELDSALES_DUCKLAKE_DATA_PATH is not s3://...",
        "helm-values.yaml: FIELDSALES_TOKEN_STORE is not catalog",
        "helm-values.yaml: FIELDSALES_DUCKDB_PATH would be a run pod's own disk",
        "helm-values.yaml: the code server has volumes, which nothing needs",
        "helm-values.yaml: the code server has volumeMounts, which nothing needs",
    ]


def test_helm_values_with_another_image_command_or_instance_are_reported(files):
    broken = copy.deepcopy(files)
    deployment = broken["helm"]["dagster-user-deployments"]["deployments"][0]
    deployment["image"]["repository"] = "registry.example.internal/other"
    deployment["codeServerArgs"] = ["-m", "other_module"]
    del broken["helm"]["concurrency"]["runs"]["tagConcurrencyLimits"]
    broken["helm"]["dagsterDaemon"]["runRetries"]["retryOnAssetOrOpFailure"] = True
    problems = deploy_problems(**broken)
    assert problems[:3] == [
        "helm-values.yaml: image registry.example.internal/other is not the compose file's "
        "fieldsales-dagster",
        "helm-values.yaml starts `dagster code-server start -h 0.0.0.0 -p 4000 -m other_module`; "
        "the image's CMD is `dagster code-server start -h 0.0.0.0 -p 4000 -m fieldsales_dagster`",
        "helm-values.yaml does not load ['fieldsales_dagster'] (workspace.yaml)",
    ]
    assert [p.split(" is ")[0] for p in problems[3:]] == [
        "helm-values.yaml's concurrency",
        "helm-values.yaml's runRetries",
    ]


def test_the_guide_names_the_secrets_the_helm_values_use(files):
    helm = files["helm"]
    (deployment,) = helm["dagster-user-deployments"]["deployments"]
    secrets = {
        entry["valueFrom"]["secretKeyRef"]["name"]
        for entry in deployment["env"]
        if "valueFrom" in entry
    }
    guide = (DEPLOY / "README.md").read_text()
    section = guide.split("\n## Several machines", 1)[1].split("\n## ", 1)[0]
    names = [*sorted(secrets), helm["global"]["postgresqlSecretName"], "deploy/helm-values.yaml"]
    assert [name for name in names if f"`{name}`" not in section] == []
