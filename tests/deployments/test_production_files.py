"""The production files of deployments/: the compose file, the worker image and the Kubernetes GPU pool's
base job template hold together, and with the code and the tests.

Each service the compose file names is wired to the next (the worker's addresses name the services and
ports that serve them), the worker gets every variable the code reads, the versions of Prefect agree
between the server image, the worker image and prefect.yaml, and a stage's `job_variables: {gpus: N}`
becomes the pod's `nvidia.com/gpu` limit. The tests' own starters run the compose file's commands
(tests/compose_commands.py); the last tests hold them to it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from cluster_services import mlflow_server_command, prefect_server_command, prefect_worker_command
from compose_commands import DEPLOYMENTS, compose_argv, compose_services, service_command, with_defaults
from object_store_server import PORT_FLAGS, ObjectStoreServer, object_store_command
from tuneline.core.config import parse_overrides
from tuneline.core.pipeline.spec import build_pipeline
from tuneline.core.pipeline.stage_unit import WORKER_ENV
from tuneline.core.training.job import TRACKING_URI_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_POOL_TEMPLATE = DEPLOYMENTS / "kubernetes-gpu-pool.json"


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def dockerfile() -> str:
    return (DEPLOYMENTS / "Dockerfile").read_text(encoding="utf-8")


def dockerfile_arg(name: str) -> str:
    return re.search(rf"^ARG {name}=(\S+)$", dockerfile(), re.MULTILINE).group(1)


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return compose_services()


@pytest.fixture(scope="module")
def gpu_template() -> dict:
    return json.loads(GPU_POOL_TEMPLATE.read_text(encoding="utf-8"))


def test_compose_names_every_service_and_each_dependency_is_healthy_first(services):
    assert {"prefect-db", "prefect-server", "mlflow-db", "mlflow", "seaweedfs", "worker", "gpu-worker"} <= set(services)
    for name, service in services.items():
        for needed, how in (service.get("depends_on") or {}).items():
            assert needed in services, f"{name} depends on a service the file does not have: {needed}"
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[needed], f"{name} waits for {needed} to be healthy, which has no healthcheck"
    declared = set(yaml.safe_load((DEPLOYMENTS / "compose.yaml").read_text())["volumes"])
    used = {mount.split(":")[0] for service in services.values() for mount in service.get("volumes", [])}
    assert used == declared


def test_the_servers_keep_their_state_in_postgres_and_mlflow_its_artifacts_in_the_bucket(services):
    prefect_db = with_defaults(services["prefect-server"]["environment"]["PREFECT_SERVER_DATABASE_CONNECTION_URL"])
    assert prefect_db.startswith("postgresql+asyncpg://prefect:") and "@prefect-db:5432/prefect" in prefect_db
    mlflow = [with_defaults(token) for token in compose_argv("mlflow")]
    assert mlflow[:2] == ["mlflow", "server"] and "--serve-artifacts" in mlflow
    assert re.fullmatch(r"postgresql://mlflow:[^@]*@mlflow-db:5432/mlflow", option(mlflow, "--backend-store-uri"))
    bucket = with_defaults(services["seaweedfs"]["environment"]["S3_BUCKET"])  # created by the store at start
    assert option(mlflow, "--artifacts-destination") == f"s3://{bucket}/mlartifacts"
    assert with_defaults(services["mlflow"]["environment"]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"]) == "false"


@pytest.mark.parametrize("worker", ["worker", "gpu-worker"])
def test_a_worker_gets_every_variable_the_code_reads_pointing_at_the_services(services, worker):
    environment = {key: with_defaults(value) for key, value in services[worker]["environment"].items()}
    store_variables = ObjectStoreServer(endpoint_url="", data_dir=Path(), process=None).env()  # what the tests give a client
    assert {WORKER_ENV, "TUNELINE_CACHE", TRACKING_URI_ENV, "PREFECT_API_URL", *store_variables} <= set(environment)
    mlflow, prefect = compose_argv("mlflow"), compose_argv("prefect-server")
    assert environment[TRACKING_URI_ENV] == f"http://mlflow:{option(mlflow, '--port')}"
    assert environment["PREFECT_API_URL"] == f"http://prefect-server:{option(prefect, '--port')}/api"
    s3_port = environment["AWS_ENDPOINT_URL"].removeprefix("http://seaweedfs:")
    assert f"{s3_port}:{s3_port}" in services["seaweedfs"]["ports"]
    assert services["mlflow"]["environment"]["AWS_ENDPOINT_URL"] == services[worker]["environment"]["AWS_ENDPOINT_URL"]
    # the cache is the volume, and the image's own TUNELINE_CACHE (a Kubernetes pod has no volume of it)
    assert f"worker-cache:{environment['TUNELINE_CACHE']}" in services[worker]["volumes"]
    assert f"ENV TUNELINE_CACHE={environment['TUNELINE_CACHE']}" in dockerfile()
    argv = compose_argv(worker)
    assert argv[:3] == ["prefect", "worker", "start"] and option(argv, "--type") == "process"


def test_the_gpu_worker_reserves_the_hosts_nvidia_gpus(services):
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert services["gpu-worker"]["profiles"] == ["gpu"]


def test_prefect_is_one_version_in_the_server_image_the_worker_image_and_prefect_yaml(services):
    declared = yaml.safe_load((DEPLOYMENTS / "prefect.yaml").read_text())["prefect-version"]
    server_image = with_defaults(services["prefect-server"]["image"])
    assert server_image.startswith(f"prefecthq/prefect:{declared}-python")
    assert with_defaults(services["worker"]["build"]["args"]["PREFECT_VERSION"]) == declared == dockerfile_arg("PREFECT_VERSION")


def test_the_image_is_built_from_what_pyproject_packages_with_its_extras():
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    copied = set(re.findall(r"^COPY (\S+) /src/\1$", dockerfile(), re.MULTILINE))
    assert set(pyproject["tool"]["setuptools"]["package-dir"].values()) <= copied
    assert re.search(rf"^COPY .*\b{pyproject['project']['readme']}\b.* /src/$", dockerfile(), re.MULTILINE)
    extras = dockerfile_arg("TUNELINE_EXTRAS").split(",")
    assert "cluster" in extras and set(extras) <= set(pyproject["project"]["optional-dependencies"])


# Prefect reads its settings from the environment once, as it is first imported: importing it here
# comes after the session's Prefect server has set PREFECT_API_URL for the in-process commands of
# later tests of this worker.
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_the_gpu_pools_template_requests_the_gpus_a_stage_asks_for(gpu_template, services):
    from prefect.utilities.templating import apply_values, find_placeholders

    configuration, variables = gpu_template["job_configuration"], gpu_template["variables"]["properties"]
    # every placeholder has a variable (the server refuses the template otherwise)
    assert {placeholder.name for placeholder in find_placeholders(configuration)} <= set(variables)
    assert variables["gpus"]["type"] == "integer" and variables["gpus"]["minimum"] == 0
    assert variables["image"]["default"] == with_defaults(services["worker"]["image"])
    overrides = parse_overrides(["work_pool=gpu-k8s", "sft.job_variables={gpus: 2, env: {NCCL_DEBUG: INFO}}"])
    pipeline = build_pipeline(yaml.safe_load((REPO_ROOT / "data/demo_pipeline.yaml").read_text()), overrides=overrides,
                              workspace="s3://tuneline/demo")
    sft = next(stage for stage in pipeline.stages if stage.name == "sft")
    assert set(sft.placement.job_variables) <= set(variables)
    defaults = {name: schema["default"] for name, schema in variables.items() if "default" in schema}
    job = apply_values(configuration, {**defaults, **sft.placement.job_variables})["job_manifest"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["env"] == {"NCCL_DEBUG": "INFO"}
    assert container["envFrom"] == [{"secretRef": {"name": variables["env_secret"]["default"]}}]
    dpo = next(stage for stage in pipeline.stages if stage.name == "dpo")  # no job_variables: the pool's default
    default_job = apply_values(configuration, {**defaults, **dpo.placement.job_variables})["job_manifest"]
    assert default_job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == variables["gpus"]["default"]


# -- the tests' starters run these commands ------------------------------------------------------

def options_of(argv: list[str]) -> dict[str, str | None]:
    """`--name value`, `-name=value` and bare flags of an argv (after its program and subcommands)."""
    found: dict[str, str | None] = {}
    for i, token in enumerate(argv):
        if token.startswith("-") and "=" in token:
            found[token.split("=", 1)[0]] = token.split("=", 1)[1]
        elif token.startswith("--"):
            following = argv[i + 1] if i + 1 < len(argv) else None
            found[token] = following if following is not None and not following.startswith("-") else None
    return found


LOCAL = {  # service: (the starter's argv, the options it may set to its own values)
    "prefect-server": (lambda: prefect_server_command(4321), {"--host", "--port", "--no-ui"}),
    "worker": (lambda: prefect_worker_command("pool-a", name="worker-a"), {"--pool", "--name"}),
    "mlflow": (lambda: mlflow_server_command(program="/venv/bin/mlflow", backend_store_uri="sqlite:////tmp/m.db",
                                             artifacts_destination="s3://b/mlartifacts", host="127.0.0.1", port=4322),
               {"--backend-store-uri", "--artifacts-destination", "--host", "--port", "--workers"}),
    "seaweedfs": (lambda: object_store_command("/venv/bin/weed", data_dir=Path("/tmp/d"), config=Path("/tmp/s3.json"),
                                               ports={flag: 4323 for flag in PORT_FLAGS}),
                  {"-dir", "-ip", "-ip.bind", "-s3.config", *(f"-{flag}" for flag in PORT_FLAGS)}),
}


@pytest.mark.parametrize("service", sorted(LOCAL))
def test_a_test_starter_runs_the_compose_command_changing_only_local_values(service):
    starter, local = LOCAL[service]
    ours, theirs = starter(), compose_argv(service)
    words = theirs[1:next(i for i, token in enumerate(theirs) if token.startswith("-"))]  # `server start`, `mini`
    start = ours.index(words[0])
    assert ours[start:start + len(words)] == words and ours[start + len(words)].startswith("-")
    mine, compose = options_of(ours), options_of(theirs)
    assert set(compose) <= set(mine), f"the {service} starter drops {set(compose) - set(mine)}"
    assert {name: value for name, value in mine.items() if name not in local} == \
           {name: value for name, value in compose.items() if name not in local}


def test_a_value_for_an_option_the_compose_command_lacks_is_refused():
    with pytest.raises(KeyError, match="the worker service's command has no --work-queue option"):
        service_command("worker", program=[sys.executable, "-m", "prefect"], values={"--work-queue": "default"})
