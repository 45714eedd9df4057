"""lm-evaluation-harness on a model in memory: the shipped arith tasks score what the model's own
log-likelihoods and greedy answers say, from any working directory, and bad names or data are refused."""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tuneline.core.errors import ConfigError
from tuneline.core.evaluation.harness import HarnessResult, flatten_metrics, run_harness_tasks
from tuneline.core.models.loading import load_model, load_tokenizer

TASKS = Path(__file__).resolve().parents[3] / "data" / "harness_tasks"
ROWS = [json.loads(line) for line in (TASKS / "arith.jsonl").read_text().splitlines()]


def prompt(row: dict) -> str:
    """arith_mc's and arith_gen's `doc_to_text`."""
    return f"Question: {row['question']}\nAnswer:"


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_base: Path, one_torch_thread):
    model = load_model(tiny_base)
    model.train()  # as a model is during training: the run must leave it so
    return model, load_tokenizer(tiny_base)


@pytest.fixture(scope="module")
def result(model_and_tokenizer, tmp_path_factory) -> HarnessResult:
    """Both shipped tasks, run from a working directory where their relative data path means nothing."""
    model, tokenizer = model_and_tokenizer
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("elsewhere"))
        return run_harness_tasks(model, tokenizer, tasks=["arith_mc", "arith_gen"], include_path=TASKS, batch_size=4,
                                 limit=None, num_fewshot=None, seed=0)


def continuation_logprob(model, tokenizer, context: str, continuation: str) -> float:
    """Sum of the log-probabilities of the continuation's tokens after the context, the context
    tokenized alone and the continuation as what the whole text adds to it (lm_eval's causal split)."""
    whole, prefix = tokenizer.encode(context + continuation), tokenizer.encode(context)
    assert whole[: len(prefix)] == prefix
    with torch.no_grad():
        logits = model(torch.tensor([whole])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prefix) - 1 : -1], dim=-1)
    return logprobs.gather(1, torch.tensor(whole[len(prefix) :])[:, None]).sum().item()


def test_multiple_choice_accuracy_is_the_models_own(result: HarnessResult, model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    picked, picked_norm, gold = [], [], []
    for row in ROWS:
        lls = np.array([continuation_logprob(model, tokenizer, prompt(row), f" {c}") for c in row["choices"]])
        picked.append(int(np.argmax(lls)))
        picked_norm.append(int(np.argmax(lls / np.array([len(c) for c in row["choices"]]))))
        gold.append(row["answer"])
    assert len(set(picked)) > 1, "the model picks one position every time: the comparison would prove little"
    accuracy = np.mean(np.array(picked) == np.array(gold))
    assert result.metrics["arith_mc_acc"] == pytest.approx(accuracy)
    assert result.metrics["arith_mc_acc_norm"] == pytest.approx(np.mean(np.array(picked_norm) == np.array(gold)))
    assert result.metrics["arith_mc_acc_stderr"] == pytest.approx(np.sqrt(accuracy * (1 - accuracy) / (len(ROWS) - 1)))
    assert result.samples == {"arith_mc": len(ROWS), "arith_gen": len(ROWS)}
    assert result.num_fewshot == {"arith_mc": 0, "arith_gen": 0}


def test_generation_exact_match_is_the_models_greedy_answers(result: HarnessResult, model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    matches = []
    for row in ROWS:
        ids = torch.tensor([tokenizer.encode(prompt(row))])
        output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id)
        answer = tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True).split("\n")[0]
        numbers = re.findall(r"([0-9]+)", answer)
        matches.append((numbers[0] if numbers else "[invalid]") == row["choices"][row["answer"]])
    assert set(result.metrics) == {"arith_mc_acc", "arith_mc_acc_stderr", "arith_mc_acc_norm",
                                   "arith_mc_acc_norm_stderr", "arith_gen_exact_match_first-number",
                                   "arith_gen_exact_match_first-number_stderr"}
    assert result.metrics["arith_gen_exact_match_first-number"] == pytest.approx(np.mean(matches))


def test_the_caller_keeps_its_model_mode_and_random_state(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    limited = run_harness_tasks(model, tokenizer, tasks=["arith_mc"], include_path=TASKS, batch_size=8, limit=5,
                                num_fewshot=1, seed=3)
    assert torch.equal(torch.rand(3), expected)
    assert model.training
    assert limited.samples == {"arith_mc": 5} and limited.num_fewshot == {"arith_mc": 1}


def test_a_tokenizer_without_a_pad_token_is_left_without_one(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    unpadded = copy.deepcopy(tokenizer)
    unpadded.pad_token = None
    run_harness_tasks(model, unpadded, tasks=["arith_mc"], include_path=TASKS, batch_size=2, limit=2, num_fewshot=None,
                      seed=0)
    assert unpadded.pad_token is None


def test_metric_names_keep_filters_and_drop_what_is_not_a_number() -> None:
    flat = flatten_metrics({"gsm": {"alias": "gsm", "exact_match,strict-match": 0.5,
                                    "exact_match_stderr,strict-match": 0.1, "acc,none": 1, "bleu_stderr,none": "N/A"},
                            "group::sub task": {"acc,none": 0.25}})
    assert flat == {"gsm_exact_match_strict-match": 0.5, "gsm_exact_match_strict-match_stderr": 0.1, "gsm_acc": 1.0,
                    "group__sub_task_acc": 0.25}


@pytest.mark.slow  # a name not in include_path is looked up among lm_eval's ~15,000 built-in tasks: ~5 s of indexing
def test_an_unknown_task_is_refused_with_the_close_names(model_and_tokenizer, tmp_path: Path) -> None:
    model, tokenizer = model_and_tokenizer
    shutil.copy(TASKS / "arith_mc.yaml", tmp_path)
    (tmp_path / "broken.yaml").write_text("task: arith_mx\ndoc_to_text: [unclosed\n")
    with pytest.raises(ConfigError) as raised:
        run_harness_tasks(model, tokenizer, tasks=["arith_mx", "arithmetic_1dx"], include_path=tmp_path, batch_size=1,
                          limit=None, num_fewshot=None, seed=0)
    first, second = raised.value.problems
    assert first.startswith(f"harness task 'arith_mx' is defined neither in the YAML files under {tmp_path} nor")
    assert "did you mean 'arith_mc'" in first and f"cannot read: {tmp_path / 'broken.yaml'}" in first
    assert "did you mean 'arithmetic_1dc'" in second  # a built-in task


def test_a_missing_data_file_is_refused_by_its_path(model_and_tokenizer, tmp_path: Path) -> None:
    model, tokenizer = model_and_tokenizer
    (tmp_path / "mine.yaml").write_text((TASKS / "arith_mc.yaml").read_text().replace("task: arith_mc", "task: mine"))
    with pytest.raises(ConfigError) as raised:
        run_harness_tasks(model, tokenizer, tasks=["mine"], include_path=tmp_path, batch_size=1, limit=None,
                          num_fewshot=None, seed=0)
    assert f"reads the data file {tmp_path / 'arith.jsonl'}, which does not exist" in str(raised.value)


def test_without_lm_eval_the_extra_to_install_is_named(model_and_tokenizer, monkeypatch) -> None:
    model, tokenizer = model_and_tokenizer
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what `import lm_eval` meets where it is not installed
    with pytest.raises(ConfigError, match=re.escape('pip install -e ".[harness]"')):
        run_harness_tasks(model, tokenizer, tasks=["arith_mc"], include_path=TASKS, batch_size=1, limit=None,
                          num_fewshot=None, seed=0)
