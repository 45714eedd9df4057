"""Train one stage on a Ray cluster through Ray Train (docs/ARCHITECTURE.md, "Training on Ray").

With `USE_RAY=1` (as LLaMA-Factory reads it) or `ray_num_workers` > 1, the job runs as a Ray Train
`TorchTrainer` on the cluster at `RAY_ADDRESS` (or a local one): each of `ray_num_workers` workers
trains the job file as a torchrun worker does (`worker.__main__.train_job_file`), in the process
group Ray Train sets up, so every other key means what it means under torchrun, and rank 0 alone
writes the output folder, the log and the MLflow metrics. A worker that dies restarts the gang
(`ray_max_failures`), which resumes from the newest complete checkpoint in the output folder.

Everything that would leave Ray waiting or failing later (no ray package, no cluster, too few
resources, storage that cannot be written) is checked before any work, each as a ConfigError.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.config.ray import mapping_value
from tuneline.core.errors import ConfigError, TunelineError
from tuneline.core.training.job import TrainJob

RAY_EXTRA = "pip install 'tuneline[ray]'"
# The variables a Ray worker gets from the launching process: the model hub's, tuneline's, MLflow's and the
# object store's. Others (PATH, CUDA_VISIBLE_DEVICES, ...) belong to the worker's own machine.
FORWARDED_ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TUNELINE_", "MLFLOW_", "AWS_", "TOKENIZERS_")
_REMOTE_SCHEMES = {"s3": "s3", "gs": "gcs", "gcs": "gcs"}
# Whether this module's ray.init made the process's connection to Ray (a process has one): a run then
# ends it; a connection made by someone else (a Ray task running the stage) is left as it was.
_connection = {"ours": False}


@dataclass(frozen=True)
class RayRun:
    """How a job runs on Ray, its keys resolved against the cluster it connected to."""

    address: str | None  # None: a local cluster started for the run
    num_workers: int
    resources_per_worker: dict[str, float]
    placement_strategy: str
    run_name: str | None
    storage_path: str | None
    storage_filesystem: Any  # a pyarrow FileSystem for a remote storage_path, else None
    max_failures: int


def import_ray(*, asked_by: str) -> Any:
    try:
        import ray
        import ray.train  # noqa: F401  (Ray Train comes with ray[train])
    except ImportError as e:
        raise ConfigError(f"{asked_by} trains on a Ray cluster, and Ray (ray[train]) is not installed in this "
                          f"environment ({e}); install the ray extra with `{RAY_EXTRA}`, or train without Ray "
                          "(unset USE_RAY and set ray_num_workers: 1).") from e
    return ray


def asked_by(job: TrainJob, env: Mapping[str, str]) -> str:
    parts = [f"USE_RAY={env['USE_RAY']}"] if env.get("USE_RAY") else []
    return " with ".join([*parts, f"'ray_num_workers: {job.ray.get('ray_num_workers', 1)}'"])


def connect(job: TrainJob, env: Mapping[str, str]) -> RayRun:
    """Connect to the cluster (`ray.init`, once per process) and check that it can run the job; each
    problem named, and this process disconnected again, before anything is written."""
    settings = job.ray
    ray = import_ray(asked_by=asked_by(job, env))
    init_kwargs = mapping_value("ray_init_kwargs", settings.get("ray_init_kwargs"))
    given = init_kwargs.pop("address", None)
    address = given or env.get("RAY_ADDRESS") or None
    storage_path, filesystem = storage(settings.get("ray_storage_path"), settings.get("ray_storage_filesystem"), env=env)
    requested = mapping_value("resources_per_worker", settings.get("resources_per_worker"))
    workers = int(settings.get("ray_num_workers") or 1)
    strategy = settings.get("placement_strategy") or "PACK"
    if address is None and not ray.is_initialized():  # a local cluster: this machine's resources, before starting it
        local = {"CPU": float(os.cpu_count() or 1), "GPU": float(_local_gpus())}
        _check_resources(requested or _default_resources(local), workers, strategy, totals=local, nodes=[local],
                         where="the local Ray cluster this command would start (RAY_ADDRESS is unset)")
    if not ray.is_initialized():
        _init(ray, address, init_kwargs, named_by="'ray_init_kwargs' address " if given else "RAY_ADDRESS=")
        _connection["ours"] = True
    try:
        totals = dict(ray.cluster_resources())
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        resources = requested or _default_resources(totals)
        _check_resources(resources, workers, strategy, totals=totals, nodes=nodes,
                         where=f"the Ray cluster at {address}" if address else "the local Ray cluster")
    except ConfigError:
        disconnect()
        raise
    failures = settings.get("ray_max_failures")
    if failures is None:  # a restart resumes from the newest checkpoint: only worth it when there is one
        failures = 1 if job.training.get("save_steps") and job.training.get("save_strategy", "steps") == "steps" else 0
    return RayRun(address=address, num_workers=workers, resources_per_worker=resources, placement_strategy=strategy,
                  run_name=settings.get("ray_run_name"), storage_path=storage_path, storage_filesystem=filesystem,
                  max_failures=int(failures))


def disconnect() -> None:
    """End the process's connection to Ray if `connect` made it."""
    if _connection["ours"]:
        import ray

        ray.shutdown()
        _connection["ours"] = False


def unanswered_address(address: str | None) -> Exception | None:
    """Why nothing answers at a `host:port` Ray address, found at once (Ray itself would retry for a
    minute); None when something does, or the address is no host:port (`auto`, `ray://`)."""
    if not address or ":" not in address or "://" in address:
        return None
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        return e
    return None


def _init(ray: Any, address: str | None, init_kwargs: dict[str, Any], *, named_by: str) -> None:
    """`ray.init`, with an address nobody answers at named."""
    if (unanswered := unanswered_address(address)) is not None:
        raise ConfigError(f"no Ray cluster answers at {named_by}{address} ({unanswered}); start one there (`ray start "
                          "--head`), point RAY_ADDRESS at its head node (host:port of its GCS), or unset "
                          "RAY_ADDRESS to train on a local Ray cluster.") from unanswered
    try:
        ray.init(address=address, **{"logging_level": "WARNING", **init_kwargs})
    except (ConnectionError, RuntimeError, ValueError, TypeError) as e:
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise ConfigError(f"could not connect to {where} with ray_init_kwargs {init_kwargs or {}}: {e}; check "
                          "RAY_ADDRESS and 'ray_init_kwargs' (arguments of ray.init).") from e


def _default_resources(totals: Mapping[str, float]) -> dict[str, float]:
    """One of the cluster's accelerators per worker, as LLaMA-Factory counts the device it runs on."""
    return {"GPU": 1.0} if totals.get("GPU", 0) > 0 else {"CPU": 1.0}


def _local_gpus() -> int:
    from tuneline.core.training.distributed import visible_gpus

    return visible_gpus({})


def _check_resources(resources: Mapping[str, float], workers: int, strategy: str, *, totals: Mapping[str, float],
                     nodes: list[Mapping[str, float]], where: str) -> None:
    """Ray waits, without a word, for resources a cluster does not have; name them instead."""
    asked = f"'ray_num_workers: {workers}' x 'resources_per_worker: {dict(resources)}'"
    problems = []
    for name, amount in resources.items():
        if workers * amount > totals.get(name, 0):
            problems.append(f"{asked} needs {workers * amount:g} {name} in all, and {where} has "
                            f"{totals.get(name, 0):g} {name}")
    fitting = sum(1 for node in nodes if all(node.get(n, 0) >= a for n, a in resources.items()))
    if not problems and fitting == 0:
        problems.append(f"{asked}: no node of {where} has {dict(resources)} for one worker")
    elif not problems and strategy == "STRICT_SPREAD" and fitting < workers:
        problems.append(f"{asked} with 'placement_strategy: STRICT_SPREAD' needs {workers} nodes that each hold "
                        f"one worker, and {where} has {fitting}")
    if problems:
        raise ConfigError([p + "; add nodes with these resources, lower ray_num_workers or resources_per_worker, "
                           "or point RAY_ADDRESS at a larger cluster." for p in problems])


def storage(path: str | None, filesystem: str | None, *, env: Mapping[str, str]) -> tuple[str | None, Any]:
    """`ray_storage_path` as Ray Train takes it (a local absolute path, or a bucket path with its pyarrow
    filesystem), once it is known to be writable or reachable."""
    if not path:
        return None, None
    scheme = path.split("://", 1)[0] if "://" in path else filesystem
    if scheme is None:
        return _local_storage(path), None
    if scheme not in _REMOTE_SCHEMES:
        raise ConfigError(f"'ray_storage_path: {path}' names a filesystem Ray Train is not given here; use a local "
                          "path or an s3://, gs:// URL ('ray_storage_filesystem': s3, gs or gcs).")
    return _remote_storage(path, protocol=_REMOTE_SCHEMES[scheme], env=env)


def _local_storage(path: str) -> str:
    folder = Path(path).expanduser().absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"'ray_storage_path: {path}' cannot be written: {existing} is not a folder this user may "
                          "write into; point ray_storage_path at a writable folder (shared by every node of the "
                          "cluster) or an s3:// URL.")
    return str(folder)


def _remote_storage(path: str, *, protocol: str, env: Mapping[str, str]) -> tuple[str, Any]:
    import fsspec
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    bucket_path = path.split("://", 1)[-1].strip("/")
    try:
        options = _s3_options(env) if protocol == "s3" else {}
        probe = fsspec.filesystem(protocol, skip_instance_cache=True, **options,
                                  **({"config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 1}}}
                                     if protocol == "s3" else {}))
        if protocol == "s3":
            probe.retries = 1  # s3fs retries a store that does not answer for minutes otherwise
        probe.ls(bucket_path.split("/", 1)[0])
    except ImportError as e:
        raise ConfigError(f"'ray_storage_path: {path}' needs the {protocol} filesystem of fsspec, which is not "
                          f"installed ({e}); `pip install 'tuneline[cluster]'` for s3, gcsfs for gs.") from e
    except Exception as e:  # noqa: BLE001  (s3fs and botocore raise many kinds for a store that does not answer)
        endpoint = env.get("AWS_ENDPOINT_URL")
        raise ConfigError(f"'ray_storage_path: {path}' cannot be reached ({type(e).__name__}: {e}); check that the bucket "
                          f"exists and that the credentials{f' and AWS_ENDPOINT_URL={endpoint}' if endpoint else ''} "
                          "point at the store.") from e
    return bucket_path, PyFileSystem(FSSpecHandler(fsspec.filesystem(protocol, skip_instance_cache=True, **options)))


def _s3_options(env: Mapping[str, str]) -> dict[str, Any]:
    """s3fs's settings from the standard AWS variables of this process, spelled out: the filesystem travels
    pickled to Ray's controller and workers, whose environment need not hold them."""
    given = {"endpoint_url": env.get("AWS_ENDPOINT_URL"), "key": env.get("AWS_ACCESS_KEY_ID"),
             "secret": env.get("AWS_SECRET_ACCESS_KEY")}
    region = env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION")
    return {**{k: v for k, v in given.items() if v}, **({"client_kwargs": {"region_name": region}} if region else {})}


def train_on_ray(job: TrainJob, job_path: Path, *, log: Callable[[str], None], env: Mapping[str, str]) -> dict[str, float]:
    """Run `job` (written to `job_path`) on Ray Train; rank 0's metrics."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    run = connect(job, env)
    if job.overwrite_output_dir:
        job = _started_over(job, job_path)
    training = job.training
    per_device, accumulation = training.get("per_device_train_batch_size", 8), training.get("gradient_accumulation_steps", 1)
    log(f"starting {run.num_workers} Ray Train worker(s) of {run.resources_per_worker} ({run.placement_strategy}) on "
        f"{f'the Ray cluster at {run.address}' if run.address else 'a local Ray cluster'}; global batch size "
        f"{per_device * run.num_workers * accumulation} = {per_device} per device x {run.num_workers} worker(s) x "
        f"{accumulation} accumulation step(s)")
    forwarded = {k: v for k, v in {**env, **job.secret_env()}.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    trainer = TorchTrainer(
        train_in_ray_worker,
        train_loop_config={"job_path": str(job_path.absolute()), "cwd": os.getcwd(), "env": forwarded,
                           "report_output": run.storage_path is not None},
        scaling_config=ScalingConfig(num_workers=run.num_workers, use_gpu=run.resources_per_worker.get("GPU", 0) > 0,
                                     resources_per_worker=run.resources_per_worker,
                                     placement_strategy=run.placement_strategy),
        run_config=RunConfig(name=run.run_name, storage_path=run.storage_path, storage_filesystem=run.storage_filesystem,
                             failure_config=FailureConfig(max_failures=run.max_failures)),
    )
    from ray.train import TrainingFailedError

    try:
        result = trainer.fit()
    except TrainingFailedError as e:
        raise _worker_problem(e) or _failed(e) from e
    finally:
        disconnect()
    return {k: v for k, v in (result.metrics or {}).items() if isinstance(v, int | float)}


def _started_over(job: TrainJob, job_path: Path) -> TrainJob:
    """`overwrite_output_dir` starts the run over, once, here: the workers' job resumes from the newest
    checkpoint, so that a gang Ray Train restarts after a failure goes on from this run's checkpoints."""
    from tuneline.core.training.checkpoints import drop_newer, trim_log
    from tuneline.core.training.job import LOG_FILE

    drop_newer(Path(job.output_dir), than=0)
    trim_log(Path(job.output_dir) / LOG_FILE, last_step=0)
    job = dataclasses.replace(job, overwrite_output_dir=False)
    job.write(job_path)
    return job


def _worker_problem(error: BaseException) -> TunelineError | None:
    """The problem a worker raised for the user to fix (a TunelineError), found in Ray's wrapping of it."""
    for failure in getattr(error, "worker_failures", {}).values():
        seen: BaseException | None = failure
        while seen is not None:
            if isinstance(seen, TunelineError):
                return TunelineError(str(seen))
            seen = getattr(seen, "cause", None) or seen.__cause__
    return None


class RayTrainingFailed(RuntimeError):
    """Ray Train gave up on the run (more worker failures than ray_max_failures) for a reason that is no
    configuration problem."""


def _failed(error: BaseException) -> Exception:
    return RayTrainingFailed(f"training on Ray failed: {error}")


def train_in_ray_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: the job file trained as a torchrun worker trains it (RANK, WORLD_SIZE and
    the process group are Ray Train's), then rank 0's metrics reported, with the output folder as the
    run's checkpoint when `ray_storage_path` asks Ray to keep it."""
    import ray.train

    os.chdir(config["cwd"])
    os.environ.update(config["env"])
    context = ray.train.get_context()
    print(f"Ray Train worker {context.get_world_rank()} of {context.get_world_size()} on node "
          f"{ray.get_runtime_context().get_node_id()}", flush=True)
    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.__main__ import train_job_file

    try:
        metrics = train_job_file(config["job_path"])
    except TunelineError as e:
        raise TunelineError(str(e)) from None  # a plain TunelineError travels back to the launcher whole
    main = context.get_world_rank() == 0
    checkpoint = None
    if main and config["report_output"]:
        checkpoint = ray.train.Checkpoint.from_directory(TrainJob.read(config["job_path"]).output_dir)
    ray.train.report(metrics if main else {}, checkpoint=checkpoint)
    sys.stdout.flush()
