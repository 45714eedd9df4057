"""`tuneline train` with `do_predict`, then `tuneline chat` on the adapter it trained.

One small LoRA run on the tiny base serves the module: its predictions are checked in
LLaMA-Factory's format, and the chat tests talk to the adapter it saved. The run goes through the
command's `main` in this process, the worker's run without its start; `tuneline chat` on piped prompts
runs as a command of its own, as a user runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
PREDICT_KEYS = {"predict_bleu-4", "predict_rouge-1", "predict_rouge-2", "predict_rouge-l"}


@pytest.fixture(scope="module")
def trained(tiny_base: Path, tmp_path_factory, one_torch_thread) -> Path:
    from conftest import run_cli_here, train_in_this_process

    folder = tmp_path_factory.mktemp("predict")
    config = {
        "model_name_or_path": str(tiny_base), "stage": "sft", "do_train": True, "do_predict": True,
        "predict_with_generate": True, "finetuning_type": "lora", "lora_rank": 4, "dataset": "demo_alpaca",
        "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": 96, "max_samples": 24, "val_size": 4,
        "output_dir": "saves/sft", "logging_steps": 1, "per_device_train_batch_size": 8, "per_device_eval_batch_size": 2,
        "learning_rate": 5.0e-3, "num_train_epochs": 1.0, "max_new_tokens": 8, "report_to": "none",
    }
    (folder / "sft.yaml").write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)
        result = run_cli_here("train", "sft.yaml", cwd=folder)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return folder / "saves/sft"


@pytest.mark.slow
def test_train_with_do_predict_writes_generated_predictions(trained: Path):
    lines = [json.loads(line) for line in (trained / "generated_predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 4  # the rows that val_size held out
    for line in lines:
        assert set(line) == {"prompt", "predict", "label"}
        assert line["prompt"].startswith("<|im_start|>user\n") and line["prompt"].endswith("<|im_start|>assistant\n")
        assert line["label"].strip() and "<|im_end|>" not in line["label"]
    results = json.loads((trained / "predict_results.json").read_text())
    assert PREDICT_KEYS <= set(results) and all(0 <= results[k] <= 100 for k in PREDICT_KEYS)
    assert PREDICT_KEYS <= set(json.loads((trained / "all_results.json").read_text()))


@pytest.mark.slow
def test_trainer_log_carries_llamafactory_keys_and_throughput(trained: Path):
    records = [json.loads(line) for line in (trained / "trainer_log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["current_steps"] for r in steps] == [1, 2, 3]
    for record in steps:
        assert {"total_steps", "lr", "epoch", "percentage", "elapsed_time", "remaining_time", "grad_norm"} <= set(record)
        assert 0 < record["tokens_per_second"] <= record["all_tokens_per_second"] and 0 < record["mfu"] < 1
    assert records[-1]["eval_loss"] > 0  # the held-out rows are evaluated too


@pytest.mark.slow
def test_chat_answers_piped_prompts_with_the_adapter(trained: Path):
    result = run_cli("chat", str(trained), "--max-new-tokens", "6", "--repetition-penalty", "3", "--no-do-sample",
                     cwd=trained.parent, stdin="Hello\nWhat is 2 plus 2?\nexit\nnever read\n")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert f"(adapter on {yaml.safe_load((trained.parents[1] / 'sft.yaml').read_text())['model_name_or_path']})" in out
    replies = [line.removeprefix("Assistant: ") for line in out.splitlines() if line.startswith("Assistant: ")]
    assert len(replies) == 2 and all(reply.strip() for reply in replies)
    assert "User: What is 2 plus 2?" in out and "never read" not in out  # nothing is read after `exit`


@pytest.mark.slow
def test_chat_session_keeps_history_streams_and_clears(trained: Path):
    from tuneline.core.config import GeneratingConfig
    from tuneline.core.inference.chat import ChatSession, load_chat_model, resolve_source

    model, tokenizer = load_chat_model(resolve_source(trained))
    session = ChatSession(model, tokenizer, GeneratingConfig(max_new_tokens=5, repetition_penalty=3.0), name="t",
                          system="Be brief.")
    streamed: list[str] = []
    first = session.reply("Hello", write=streamed.append)
    assert "".join(streamed).strip() == first  # the answer arrived piece by piece through the streamer
    session.reply("And again?", write=lambda _: None)
    assert [m["role"] for m in session.history] == ["user", "assistant", "user", "assistant"]
    rendered = tokenizer.decode(session._prompt()[0])
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "Hello" in rendered
    session.clear()
    assert session.history == []


def test_chat_on_a_missing_path_exits_2_with_a_clear_message(tmp_path: Path):
    from conftest import run_cli_here

    result = run_cli_here("chat", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert result.returncode == 2
    assert f"chat PATH '{tmp_path / 'nowhere'}' does not exist" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_chat_paths_resolve_for_artifacts_and_workspaces(trained: Path, tmp_path: Path):
    import shutil

    from tuneline.core.errors import ConfigError
    from tuneline.core.inference.chat import resolve_source
    from tuneline.core.store.artifacts import write_artifact

    workspace = tmp_path / "workspace"
    with write_artifact(workspace, "trained", "sft-abc", config={}) as draft:
        for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(trained / name, draft.path / name)
    with write_artifact(workspace, "tokenized", "tok-abc", config={}) as draft:
        (draft.path / "train").mkdir()
    source = resolve_source(workspace / "artifacts/trained/sft-abc")
    assert source.adapter == workspace / "artifacts/trained/sft-abc" and source.tokenizer == str(source.adapter)
    assert source.model == json.loads((trained / "adapter_config.json").read_text())["base_model_name_or_path"]
    with pytest.raises(ConfigError, match="'tokenized' artifact, which holds no model"):
        resolve_source(workspace / "artifacts/tokenized/tok-abc")
    with pytest.raises(ConfigError, match="is a workspace; pass one of its model artifact folders: .*sft-abc"):
        resolve_source(workspace)
    partial = workspace / "artifacts/trained/.sft-def.partial"
    shutil.copytree(workspace / "artifacts/trained/sft-abc", partial)
    (partial / "manifest.json").unlink()
    with pytest.raises(ConfigError, match="unfinished artifact"):
        resolve_source(partial)


def test_chat_reads_a_llamafactory_inference_yaml(tiny_base: Path, tmp_path: Path, monkeypatch):
    """`tuneline chat CONFIG.yaml`: the YAML's model, template, template keys (default_system) and generation
    keys (greedy, repetition_penalty) apply; the answer is the model's greedy generate() on the training prompt."""
    import io

    from conftest import run_cli_here
    from serving_server import greedy_reference, inference_yaml

    config = yaml.safe_load(inference_yaml(tiny_base, tmp_path).read_text())
    (tmp_path / "chat.yaml").write_text(yaml.safe_dump({**config, "default_system": "Be brief."}))
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2 plus 2?\nexit\n"))
    result = run_cli_here("chat", str(tmp_path / "chat.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    replies = [line.removeprefix("Assistant: ") for line in result.stdout.splitlines() if line.startswith("Assistant: ")]
    _, _, expected = greedy_reference(tiny_base)([{"role": "user", "content": "What is 2 plus 2?"}], "Be brief.")
    assert replies == [expected.strip()] and expected.strip()
