"""Prediction with generation: prompts and labels recovered from tokenized rows, answers, the output files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.config import GeneratingConfig
from tuneline.core.evaluation.predict import (
    PREDICTIONS_FILE,
    do_predict,
    generate_answers,
    generation_kwargs,
    last_trained_span,
    predict_examples,
)

M = -100  # a masked label


def test_last_trained_span_is_the_final_answer():
    assert last_trained_span([M, M, 7, 8, M, M, 11, 12, 13, M]) == (6, 9)
    assert last_trained_span([M, 5, 6]) == (1, 3)
    assert last_trained_span([M, M]) is None


def test_a_multi_turn_row_is_cut_before_its_last_answer():
    row = {"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "labels": [M, M, 3, 4, M, M, 7, 8]}
    assert predict_examples([row]) == [([1, 2, 3, 4, 5, 6], [7, 8])]


def test_packed_rows_give_one_example_per_packed_sequence():
    row = {  # two examples, then two padding positions (position 0, label masked)
        "input_ids": [1, 2, 3, 4, 5, 6, 7, 0, 0],
        "labels": [M, M, 3, M, M, 6, 7, M, M],
        "position_ids": [0, 1, 2, 0, 1, 2, 3, 0, 0],
    }
    assert predict_examples([row]) == [([1, 2], [3]), ([4, 5], [6, 7])]


def test_rows_encoded_for_prediction_keep_their_prompt_and_reply():
    assert predict_examples([{"input_ids": [1, 2, 3], "labels": [4, 5]}]) == [([1, 2, 3], [4, 5])]


def test_generation_kwargs_pass_sampling_knobs_only_when_sampling(tiny_base: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    greedy = generation_kwargs(GeneratingConfig(max_new_tokens=5, do_sample=False), tokenizer)
    assert greedy["max_new_tokens"] == 5 and greedy["do_sample"] is False
    assert not {"temperature", "top_p", "top_k"} & set(greedy)
    assert greedy["eos_token_id"][0] == tokenizer.eos_token_id
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in greedy["eos_token_id"]  # the template tokens stop too
    sampled = generation_kwargs(GeneratingConfig(do_sample=True, temperature=0.5, top_k=3), tokenizer)
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"]) == (0.5, 3, 0.7)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_base: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_base), AutoTokenizer.from_pretrained(tiny_base)


def test_left_padded_batches_answer_as_one_prompt_at_a_time(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts = [tokenizer.encode(text) for text in ("The capital of France", "Two plus two is", "Hi")]
    settings = GeneratingConfig(max_new_tokens=6, do_sample=False, repetition_penalty=3.0)  # the penalty keeps a random model varied
    one_by_one = generate_answers(model, tokenizer, prompts, generating=settings, batch_size=1)
    batched = generate_answers(model, tokenizer, prompts, generating=settings, batch_size=3)
    assert batched == one_by_one
    assert all(0 < len(answer) <= 6 for answer in one_by_one)
    assert tokenizer.pad_token_id not in sum(one_by_one, [])


def test_do_predict_writes_llamafactory_predictions(model_and_tokenizer, tmp_path: Path):
    from datasets import Dataset

    model, tokenizer = model_and_tokenizer
    prompt = tokenizer.encode("<|im_start|>user\nWhat is 2 plus 2?<|im_end|>\n<|im_start|>assistant\n")
    answer = tokenizer.encode("2 plus 2 is 4.<|im_end|>\n")
    rows = Dataset.from_list([{"input_ids": prompt + answer, "labels": [M] * len(prompt) + answer}] * 2)
    metrics = do_predict(model, tokenizer, rows, output_dir=tmp_path, generating=GeneratingConfig(max_new_tokens=4),
                         batch_size=2)
    lines = [json.loads(line) for line in (tmp_path / PREDICTIONS_FILE).read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 2
    assert set(lines[0]) == {"prompt", "predict", "label"}
    assert lines[0]["prompt"] == "<|im_start|>user\nWhat is 2 plus 2?<|im_end|>\n<|im_start|>assistant\n"  # special tokens kept
    assert lines[0]["label"] == "2 plus 2 is 4.\n"  # decoded without them
    assert {"predict_bleu-4", "predict_rouge-1", "predict_rouge-2", "predict_rouge-l"} <= set(metrics)
    assert all(0 <= metrics[k] <= 100 for k in metrics if k.startswith("predict_rouge") or k == "predict_bleu-4")


def test_do_predict_without_a_predict_set_is_a_config_error(model_and_tokenizer, tmp_path: Path):
    from tuneline.core.errors import ConfigError

    model, tokenizer = model_and_tokenizer
    with pytest.raises(ConfigError, match="eval_dataset.*val_size"):
        do_predict(model, tokenizer, None, output_dir=tmp_path, generating=GeneratingConfig())


def test_predict_settings_that_cannot_work_are_refused_before_training():
    from tuneline.core.errors import ConfigError
    from tuneline.core.stages.registry import build_stage_config

    with pytest.raises(ConfigError) as caught:
        build_stage_config({"stage": "pt", "do_predict": True, "train_on_prompt": True})
    message = str(caught.value)
    assert "'do_predict: true' needs 'predict_with_generate: true'" in message
    with pytest.raises(ConfigError) as caught:
        build_stage_config({"stage": "sft", "do_predict": True, "predict_with_generate": True, "dataset": "d"})
    assert "needs a predict set: name 'eval_dataset' or hold rows out with 'val_size'" in str(caught.value)
    build_stage_config({"stage": "sft", "do_predict": True, "predict_with_generate": True, "val_size": 0.1, "dataset": "d"})
