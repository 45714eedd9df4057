"""Running a pipeline through `tuneline run` in tests: to the end, or until a stage has a checkpoint
(then SIGKILLed, process group and all), and reading what it printed and saved."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuneline.core.training.checkpoints import RECORD_FILE, checkpoint_step, checkpoints, newest_complete
from tuneline.core.training.job import LOG_FILE
from tuneline.core.worker.launch import JOB_FILE


def command(chain: Path, workspace: Path) -> list[str]:
    # -v: the workers' output (their "resuming from ..." line) reaches the console through Prefect's log
    return [sys.executable, "-m", "tuneline.flows.cli", "-v", "run", str(chain), "--workspace", str(workspace)]


def run_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run_to_end(chain: Path, workspace: Path, log: Path) -> str:
    with log.open("w") as out:
        code = subprocess.run(command(chain, workspace), stdout=out, stderr=subprocess.STDOUT, env=run_env(),
                              timeout=600).returncode
    output = log.read_text()
    assert code == 0, output[-4000:]
    return output


def run_until_checkpoint(chain: Path, workspace: Path, log: Path, *, stage: str) -> dict:
    """Start the chain and SIGKILL its process group once `stage` has a complete checkpoint and has
    logged a later step; return the draft, the step it can resume from and the killed MLflow run."""
    with log.open("w") as out:
        process = subprocess.Popen(command(chain, workspace), stdout=out, stderr=subprocess.STDOUT, env=run_env(),
                                   start_new_session=True)
    deadline = time.monotonic() + 300
    draft = None
    while process.poll() is None and time.monotonic() < deadline:
        draft = draft or draft_of(workspace, stage)
        if draft is not None and ready_to_kill(draft):
            break
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, f"the run ended before {stage} could be killed:\n{log.read_text()[-4000:]}"
    assert draft is not None and draft.is_dir(), f"{stage} never started"
    resumable = newest_complete(draft, log=lambda _: None)
    assert resumable is not None
    job = json.loads((draft / JOB_FILE).read_text())  # written before the worker started
    return {"stage": stage, "draft": draft, "step": checkpoint_step(resumable), "run_id": job["run_id"],
            "tracking_uri": job["tracking_uri"]}


def draft_of(workspace: Path, stage: str) -> Path | None:
    """The draft (`.<stage>-<hash>.partial`) of training stage `stage`, once its launcher wrote the job file."""
    pattern = re.compile(rf"\.{re.escape(stage)}-[0-9a-f]+\.partial")
    drafts = (workspace / "artifacts" / "trained").glob(".*.partial")
    return next((d for d in drafts if pattern.fullmatch(d.name) and (d / JOB_FILE).is_file()), None)


def ready_to_kill(draft: Path) -> bool:
    saved = [checkpoint_step(c) for c in checkpoints(draft) if (c / RECORD_FILE).is_file()]
    log = draft / LOG_FILE
    lines = log.read_text().splitlines() if log.is_file() else []
    logged = [json.loads(line)["current_steps"] for line in lines if line.endswith("}")]
    return bool(saved) and max(logged, default=0) > min(saved)


def stage_rows(output: str) -> dict[str, tuple[str, str]]:
    """{stage: (status, artifact path)} from the printed summary."""
    rows = re.findall(r"^  (\S+)\s+(computed|served from cache)\s+(?:\S+ s)?\s+(\S+)$", output, flags=re.M)
    return {name: (status, path) for name, status, path in rows}


def progress(output: str) -> dict[str, str]:
    """{stage: "served from cache" or "computed"} from the line printed as each stage ends (a killed
    run prints no summary)."""
    lines = re.findall(r"^(\S+): (served from cache|computed) ?(?:in [\d.]+ s)?$", output, flags=re.M)
    return dict(lines)


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))  # adapter_model or model, and a reward model's head
    return {f"{f.name}:{name}": tensor for f in files for name, tensor in load_file(f).items()}


def max_difference(a: dict, b: dict) -> float:
    assert a and a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def check_rerun(output: str, killed: dict) -> None:
    """The stages before the killed one come from cache, the killed one resumes at its checkpoint,
    and MLflow links every cache hit to the run that computed it and the resumed run to the killed one."""
    from mlflow.tracking import MlflowClient

    done = progress(output)
    names = list(done)
    position = names.index(killed["stage"])
    assert [done[n] for n in names[:position]] == ["served from cache"] * position, done
    assert {done[n] for n in names[position:]} == {"computed"}, done
    resumed = [line for line in output.splitlines() if "resuming from " in line]
    assert len(resumed) == 1 and killed["step"] > 0, resumed
    step = killed["step"]
    assert f"{killed['draft'].name}/checkpoint-{step} (step {step})" in resumed[0], (resumed, killed)

    client = MlflowClient(killed["tracking_uri"])
    old = client.get_run(killed["run_id"])
    assert old.info.status == "KILLED"
    assert client.get_run(old.data.tags["mlflow.parentRunId"]).info.status == "KILLED"
    experiment = [old.info.experiment_id]
    [stage_run] = client.search_runs(experiment, f"tags.`tuneline.resumed_from_run` = '{killed['run_id']}'")
    assert stage_run.info.run_name == killed["stage"] and stage_run.info.status == "FINISHED"
    assert stage_run.data.tags["tuneline.resumed_from_step"] == str(step)
    children = client.search_runs(experiment, f"tags.mlflow.parentRunId = '{stage_run.data.tags['mlflow.parentRunId']}'")
    # the artifact stages' hits (a register stage that finds its version registered already is one too)
    hits = [c for c in children if c.data.tags["tuneline.cache_hit"] == "true" and c.info.run_name in done]
    assert sorted(c.info.run_name for c in hits) == sorted(names[:position])
    for hit in hits:
        producer = client.get_run(hit.data.tags["tuneline.produced_by_run"])
        assert producer.data.tags["tuneline.cache_hit"] == "false" and producer.info.status == "FINISHED"
        assert producer.data.tags["tuneline.key"] == hit.data.tags["tuneline.key"]


def seed_workspace(source: dict, workspace: Path, *, stages: list[str]) -> None:
    """`workspace` holding the MLflow store of the `source` run and the artifacts of its `stages`:
    what a run killed in the stage after them has finished."""
    import shutil

    workspace.mkdir(parents=True)
    shutil.copy2(source["workspace"] / "mlflow.db", workspace / "mlflow.db")
    for name in stages:
        artifact = Path(source["rows"][name][1])
        shutil.copytree(artifact, workspace / artifact.relative_to(source["workspace"]))


def run_uninterrupted(chain: Path, folder: Path, *, what: str) -> dict:
    """Run `chain` to the end in workspace `folder`/A; what the tests of a chain read of it."""
    started = time.monotonic()
    output = run_to_end(chain, folder / "A", folder / "A.log")
    print(f"uninterrupted {what}: {time.monotonic() - started:.0f} s")
    return {"chain": chain, "workspace": folder / "A", "output": output, "rows": stage_rows(output)}
