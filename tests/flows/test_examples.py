"""Every YAML under data/examples/ runs through the command its header names, made tiny.

Each example is read as it ships and run with `TINY`'s edits: `model_name_or_path` the session's tiny base
(`tiny_base`, or a tiny Qwen2-VL built from its tokenizer for the multimodal one), `dataset_dir` the
repository's folder the example names, outputs in this module's folder, a path that names another
example's output (`reward_model`, `adapter_name_or_path`) that example's output here, and a step or two on
a few short rows. The template is the example's own. Everything runs in this process: `tuneline train`,
`eval`, `export` and `run` through the command's `main`, the training jobs of `train` and of `run`'s stages
in this process too (`in_process_launch`); the pipelines against the session's Prefect server, in one
workspace, as both name `./workspace`; the inference YAML is read as `tuneline api` reads it and served by
the API's app, which answers one chat completion.

`RUNNER` says how each file runs; a file it does not name fails `test_every_example_has_a_runner`.
"""

from __future__ import annotations

import gc
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmark_files import write_mmlu
from conftest import in_process_launch, run_cli_here, train_in_this_process
from tuneline.core.training.method_record import LINE_PREFIX, MethodRecord

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "data" / "examples"
RUNNER = {
    "pt.yaml": "train", "sft.yaml": "train", "rm.yaml": "train", "dpo.yaml": "train", "kto.yaml": "train",
    "orpo.yaml": "train", "simpo.yaml": "train", "ppo.yaml": "train", "grpo.yaml": "train", "rloo.yaml": "train",
    "sft_multimodal.yaml": "train", "eval.yaml": "eval", "export.yaml": "export", "inference.yaml": "api",
    "pipeline_sft_dpo.yaml": "run", "pipeline_grpo.yaml": "run",
}
# Examples that name another example's output: key -> the example that writes it.
CHAINED = {"ppo.yaml": {"reward_model": "rm.yaml"}, "eval.yaml": {"adapter_name_or_path": "sft.yaml"},
           "export.yaml": {"adapter_name_or_path": "sft.yaml"}, "inference.yaml": {"adapter_name_or_path": "sft.yaml"}}
TINY = {"max_steps": 2, "max_samples": 8, "cutoff_len": 64, "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 2, "gradient_accumulation_steps": 1, "logging_steps": 1, "save_steps": 500,
        "warmup_ratio": 0.0}
ONLINE_RL = {"num_generations": 2, "max_completion_length": 4}  # grpo, rloo: 2 answers of 4 tokens per prompt
EDITS = {"ppo.yaml": {"max_new_tokens": 4}, "grpo.yaml": ONLINE_RL, "rloo.yaml": ONLINE_RL}
# The loss each kind's run records (its `MethodRecord`): the example trains what its header says.
TRAINER_LOSS = "transformers.trainer.Trainer.compute_loss"
LOSSES = {"pt.yaml": TRAINER_LOSS, "sft.yaml": TRAINER_LOSS, "sft_multimodal.yaml": TRAINER_LOSS,
          "rm.yaml": "trl.trainer.reward_trainer.RewardTrainer.compute_loss",
          "dpo.yaml": "trl.trainer.dpo_trainer.DPOTrainer.compute_loss",
          "kto.yaml": "trl.trainer.kto_trainer.KTOTrainer.compute_loss",
          "orpo.yaml": "trl.experimental.orpo.orpo_trainer.ORPOTrainer.compute_loss",
          "simpo.yaml": "trl.experimental.cpo.cpo_trainer.CPOTrainer.compute_loss",  # SimPO is CPO's loss_type simpo
          "ppo.yaml": "tuneline.core.stages.ppo.trainer.PPOTrainer._losses",
          "grpo.yaml": "trl.trainer.grpo_trainer.GRPOTrainer.compute_loss",
          "rloo.yaml": "trl.trainer.rloo_trainer.RLOOTrainer.compute_loss"}


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def test_every_example_has_a_runner():
    found = {path.name for path in example_files()}
    assert found == set(RUNNER), f"say in RUNNER how these run: {sorted(found - set(RUNNER))}; " \
                                 f"gone: {sorted(set(RUNNER) - found)}"
    assert set(RUNNER.values()) <= {"train", "eval", "export", "api", "run"}


class ExampleRuns:
    """Each example run once, after the examples whose outputs it names; `outputs[name]`: its output folder."""

    def __init__(self, root: Path, tiny_base: Path) -> None:
        self.root, self.tiny_base = root, tiny_base
        self.outputs: dict[str, Path] = {}
        self.printed: dict[str, str] = {}

    def output(self, name: str) -> Path:
        if name not in self.outputs:
            self.outputs[name] = self._run(name)
        return self.outputs[name]

    def _run(self, name: str) -> Path:
        config = yaml.safe_load((EXAMPLES / name).read_text())
        folder = self.root / name.removesuffix(".yaml")
        folder.mkdir()
        runner = RUNNER[name]
        if runner == "run":
            return self._run_pipeline(name, config, folder)
        edits: dict[str, Any] = {"model_name_or_path": str(self.model_for(name))}
        edits.update({key: str(self.output(producer)) for key, producer in CHAINED.get(name, {}).items()})
        if "dataset_dir" in config:
            edits["dataset_dir"] = str(REPO / config["dataset_dir"])
        if runner == "train":
            edits.update({**TINY, **EDITS.get(name, {}), "output_dir": str(folder / "out")})
        elif runner == "eval":
            write_mmlu(folder / "evaluation")
            edits.update({"task_dir": str(folder / "evaluation"), "save_dir": str(folder / "out")})
        elif runner == "export":
            edits["export_dir"] = str(folder / "out")
        elif runner == "api":
            edits["max_new_tokens"] = 4
        path = folder / name
        path.write_text(yaml.safe_dump({**config, **edits}, sort_keys=False))
        if runner == "api":
            return path
        result = run_cli_here(runner, str(path), cwd=folder)
        assert result.returncode == 0, f"{name}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        self.printed[name] = result.stdout
        return folder / "out"

    def model_for(self, name: str) -> Path:
        if name == "sft_multimodal.yaml":
            return self.vision_model()
        return self.tiny_base

    def vision_model(self) -> Path:
        """A tiny Qwen2-VL on the tiny base's tokenizer (its vision tokens added)."""
        from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

        folder = self.root / "qwen2_vl"
        if not folder.is_dir():
            config = VisionModelConfig(family="qwen2_vl", hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                       num_key_value_heads=1)
            build_vision_language_model(self.tiny_base, folder, config=config)
        return folder

    def _run_pipeline(self, name: str, pipeline: dict, folder: Path) -> Path:
        """The pipeline with its first stage on the tiny base, every stage a step or two on a few rows."""
        data = str(REPO / pipeline["defaults"]["dataset_dir"])
        pipeline["defaults"] = {**pipeline["defaults"], "dataset_dir": data, **TINY}
        for stage in pipeline["stages"]:
            if "model_name_or_path" in stage:
                stage["model_name_or_path"] = str(self.tiny_base)
            stage.update({"max_steps": TINY["max_steps"], **(ONLINE_RL if stage["stage"] in ("grpo", "rloo") else {})})
        if "evaluate" in pipeline:
            pipeline["evaluate"].update({"max_samples": 2, "max_new_tokens": 4})
        path = folder / name
        path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
        workspace = self.root / "workspace"
        result = run_cli_here("run", str(path), "--workspace", str(workspace), cwd=folder)
        assert result.returncode == 0, f"{name}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        self.printed[name] = result.stdout
        return workspace


@pytest.fixture(scope="module")
def runs(tiny_base: Path, tmp_path_factory, one_torch_thread, prefect_server) -> Iterator[ExampleRuns]:
    root = tmp_path_factory.mktemp("examples")
    started = time.process_time()
    gc.freeze()  # the trainers' gc.collect() calls would otherwise walk every object the imports made, each time
    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)
        # `tuneline run`'s training stages too: no warm worker, each job run in this process
        patch.setattr("tuneline.core.pipeline.train_unit.launch_training", in_process_launch)
        patch.setattr("tuneline.core.pipeline.train_unit.warm_up", lambda: False)
        yield ExampleRuns(root, tiny_base)
    gc.unfreeze()
    print(f"\n{len(example_files())} examples in {time.process_time() - started:.0f} s of CPU")


def trained_record(printed: str) -> MethodRecord:
    records = [MethodRecord.from_line(line) for line in printed.splitlines() if line.startswith(LINE_PREFIX)]
    assert len(records) == 1, printed[-2000:]
    return records[0]


def assert_trained(name: str, output: Path, printed: str) -> None:
    written = {path.name for path in output.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "train_results.json"} <= written, sorted(written)
    assert math.isfinite(json.loads((output / "train_results.json").read_text())["train_loss"])
    state = output / "trainer_state.json"
    if state.is_file():  # the trainer-based kinds; ppo's own loop writes none
        assert json.loads(state.read_text())["global_step"] == TINY["max_steps"]
    assert trained_record(printed).loss == LOSSES[name], trained_record(printed)


def assert_pipeline_ran(name: str, workspace: Path, printed: str) -> None:
    pipeline = yaml.safe_load((EXAMPLES / name).read_text())
    trained = {stage["name"] for stage in pipeline["stages"]}
    ended = {line.split(" in ")[0] for line in printed.splitlines()}  # "sft: computed in 1.4 s"
    assert {f"{stage}: computed" for stage in trained} <= ended, printed
    exported = Path(re.search(r"^exported model: +(\S+)$", printed, re.M).group(1))
    assert exported.parent == workspace / "artifacts" / "export"
    assert {"config.json", "model.safetensors"} <= {path.name for path in exported.iterdir()}
    if "evaluate" in pipeline:  # the evaluated stage's and its baseline's held-out loss
        assert re.search(r"^  eval_loss +\d", printed, re.M), printed
        assert re.search(r"^  baseline_eval_loss +\d", printed, re.M), printed
    register = pipeline["register"]
    registered = f"registered model: {register['model_name']} version 1 alias @{register['alias']}"
    assert registered in printed, printed[-2000:]


def served_answer(inference: Path) -> dict:
    """One chat completion from the API `tuneline api INFERENCE.yaml` serves (its app, in this process)."""
    from fastapi.testclient import TestClient

    from tuneline.core.serving.app import create_app
    from tuneline.core.serving.engine import load_engine
    from tuneline.core.serving.sources import served_model

    served = served_model(str(inference), command="tuneline api")
    with TestClient(create_app(load_engine(served), model_name=served.name, api_key=None)) as client:
        request = {"model": served.name, "messages": [{"role": "user", "content": "Hi"}]}
        response = client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("path", example_files(), ids=lambda path: path.stem)
def test_example_runs(runs: ExampleRuns, path: Path):
    name = path.name
    assert name in RUNNER, f"{name}: say in RUNNER how it runs"
    output = runs.output(name)
    runner = RUNNER[name]
    if runner == "train":
        assert_trained(name, output, runs.printed[name])
        if name == "sft_multimodal.yaml":  # the adapter's folder keeps the image processor
            assert (output / "preprocessor_config.json").is_file()
    elif runner == "eval":
        assert {"results.json", "results.log"} <= {p.name for p in output.iterdir()}
        assert "Average:" in runs.printed[name]
    elif runner == "export":
        assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in output.iterdir()}
        assert not (output / "adapter_config.json").exists()  # merged
    elif runner == "api":
        answer = served_answer(output)
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert 0 < answer["usage"]["completion_tokens"] <= 4  # the example's max_new_tokens, edited to 4
    else:
        assert_pipeline_ran(name, output, runs.printed[name])
