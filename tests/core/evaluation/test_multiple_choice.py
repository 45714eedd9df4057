"""`tuneline eval`: LLaMA-Factory's multiple-choice benchmark evaluation.

The acceptance tests run the command in this process on the tiny model and compare every prediction
with one computed here from LLaMA-Factory's own strings: the prompt text written out by hand for the
`default` template, tokenized whole, one question at a time through the model, the argmax over the
four letters' tokens at the last position; the n-shot examples drawn by `datasets`' own unseeded
shuffle after `np.random.seed(seed)`, as LLaMA-Factory's evaluator draws them. A check beside them
shows that a wrong prompt, position, choice token or draw changes those predictions on this data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmark_files import CMMLU_SUBJECTS, MMLU_SUBJECTS, Rows, write_ceval, write_cmmlu, write_mmlu
from conftest import assert_refused, run_cli_here
from tuneline.core.config import read_stage_config
from tuneline.core.config.benchmark import read_eval_config
from tuneline.core.errors import ConfigError
from tuneline.core.evaluation.benchmark_data import read_benchmark
from tuneline.core.evaluation.multiple_choice import BenchmarkResult, SubjectResult, example_draws, write_results

# LLaMA-Factory 0.9.5's eval/template.py
STRINGS = {
    "en": ("The following are multiple choice questions (with answers) about {subject}.\n\n", "\n{choice}. {content}",
           "\nAnswer:"),
    "zh": ("以下是中国关于{subject}考试的单项选择题，请选出其中的正确答案。\n\n", "\n{choice}. {content}", "\n答案："),
}
CATEGORY_ORDER = ("Average", "STEM", "Social Sciences", "Humanities", "Other")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> tuple[Path, Rows, Rows]:
    folder = tmp_path_factory.mktemp("evaluation")
    return folder, write_mmlu(folder), write_cmmlu(folder)


def eval_config(tmp_path: Path, model: Path, task_dir: Path, **keys) -> Path:
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model), "template": "default", "task": "mmlu_test",
                                      "task_dir": str(task_dir), "batch_size": 3, **keys}, allow_unicode=True))
    return config


# ---------------------------------------------------------------- the reference, by hand


def drawn_examples(rows: Rows, subjects: dict, *, n_shot: int, seed: int) -> dict[str, list[list[dict]]]:
    """Each test question's examples as LLaMA-Factory's evaluator draws them: `dataset["train"].shuffle()`
    (unseeded, after transformers.set_seed(seed)) and the first n_shot, subject after subject."""
    from datasets import Dataset

    key = (id(rows), tuple(subjects), n_shot, seed)
    if key in _DRAWN:
        return _DRAWN[key]
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        drawn = {}
        for subject in subjects:
            dev = Dataset.from_list(rows[subject]["dev"])
            drawn[subject] = [list(dev.shuffle().select(range(min(n_shot, len(dev))))) for _ in rows[subject]["test"]]
    finally:
        np.random.set_state(saved)
    _DRAWN[key] = drawn
    return drawn


_DRAWN: dict = {}  # datasets' shuffles cost a fingerprint each: drawn once per module


def prompt_text(row: dict, shots: list[dict], *, subject_name: str, lang: str, eos: str, system: bool = True) -> str:
    """The `default` template's text (`Human: ...</s>\\nAssistant:`) of the examples and the question."""
    head, choice, cue = STRINGS[lang]
    text = ""
    for i, shown in enumerate([*shots, row]):
        content = shown["question"] + "".join(choice.format(choice=c, content=shown[c]) for c in "ABCD") + cue
        content = (head.format(subject=subject_name) if i == 0 and system else "") + content
        text += f"Human: {content}{eos}\nAssistant:" + ("" if shown is row else f"{shown['answer']}{eos}\n")
    return text


def prompt_texts(rows: Rows, subjects: dict, *, eos: str, n_shot: int, lang: str, seed: int = 42,
                 system: bool = True) -> dict[str, list[str]]:
    """Each test question's prompt text, subject by subject."""
    drawn = drawn_examples(rows, subjects, n_shot=n_shot, seed=seed)
    return {subject: [prompt_text(row, shots, subject_name=name, lang=lang, eos=eos, system=system)
                      for row, shots in zip(rows[subject]["test"], drawn[subject], strict=True)]
            for subject, (name, _) in subjects.items()}


def read_states(model, tokenizer, texts: list[str]):
    """What the output layer reads at the last two positions of each text ([text, position -2 or -1,
    hidden]), each text tokenized whole and run alone; kept per model and texts, since the checks
    below ask for the same texts more than once."""
    import torch

    key = (id(model), tuple(texts))
    if key in _STATES:
        return _STATES[key]
    states = []
    hook = model.lm_head.register_forward_hook(lambda module, inputs, output: states.append(inputs[0][0, -2:]))
    try:
        with torch.no_grad():
            for text in texts:
                model(input_ids=torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]]))
    finally:
        hook.remove()
    _STATES[key] = torch.stack(states)
    return _STATES[key]


_STATES: dict = {}


@pytest.fixture(scope="module")
def context_base(tiny_base: Path, task_dir, tmp_path_factory) -> Path:
    """tiny_base with its output rows of A, B, C and D replaced, so that the question decides the letter.

    A random tiny model reads nearly the same state at the answer cue whatever came before (the cue's
    own token dominates it), so it gives every question the same letter, and equal predictions could
    not tell a wrong prompt from the right one. Here each letter's row is a direction orthogonal to the
    mean state of each kind of prompt the tests score: the letters' logits are then each question's own
    deviation from that mean, and the letter changes from question to question."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    _, mmlu, cmmlu = task_dir
    kinds = [prompt_texts(mmlu, MMLU_SUBJECTS, eos=tokenizer.eos_token, n_shot=n, lang="en") for n in (0, 5)]
    kinds.append(prompt_texts(cmmlu, CMMLU_SUBJECTS, eos=tokenizer.eos_token, n_shot=5, lang="zh", seed=7))
    means = torch.stack([read_states(model, tokenizer, [t for texts in kind.values() for t in texts])[:, -1].mean(0)
                         for kind in kinds])
    basis, _ = torch.linalg.qr(means.T)
    rows = torch.randn(4, means.shape[1], generator=torch.Generator().manual_seed(0))
    rows -= rows @ basis @ basis.T
    weight = model.lm_head.weight.detach().clone()
    weight[[tokenizer.encode(c, add_special_tokens=False)[-1] for c in "ABCD"]] = 50 * rows / rows.norm(dim=1, keepdim=True)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(weight)
    folder = tmp_path_factory.mktemp("context_base")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reference(context_base: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(context_base, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(context_base))


def hand_predictions(reference, rows: Rows, subjects: dict, *, n_shot: int, lang: str, seed: int = 42, position: int = -1,
                     letters: str = "ABCD", system: bool = True) -> dict[str, list[str]]:
    """Each test question's letter: the argmax over the letters' logits at `position` of its prompt text."""
    import torch

    model, tokenizer = reference
    choice_ids = [tokenizer.encode(letter, add_special_tokens=False)[-1] for letter in letters]
    texts = prompt_texts(rows, subjects, eos=tokenizer.eos_token, n_shot=n_shot, lang=lang, seed=seed, system=system)
    with torch.no_grad():
        return {subject: ["ABCD"[i] for i in model.lm_head(read_states(model, tokenizer, subject_texts)[:, position])
                          [:, choice_ids].argmax(dim=1).tolist()]
                for subject, subject_texts in texts.items()}


def expected_log(predictions: dict[str, list[str]], rows: Rows, subjects: dict) -> str:
    right: dict[str, list[bool]] = {category: [] for category in CATEGORY_ORDER}
    for subject, (_, category) in subjects.items():
        marks = [p == r["answer"] for p, r in zip(predictions[subject], rows[subject]["test"], strict=True)]
        right[category] += marks
        right["Average"] += marks
    return "\n".join(f"{category:>15}: {100 * np.mean(marks):.2f}" for category, marks in right.items() if marks)


# ---------------------------------------------------------------- acceptance


@pytest.mark.parametrize("n_shot", [0, 5])
def test_predictions_and_accuracies_equal_the_models_logits_read_by_hand(n_shot, task_dir, reference, context_base, tmp_path):
    folder, mmlu, _ = task_dir
    save_dir = tmp_path / "saves" / "eval"
    result = run_cli_here("eval", str(eval_config(tmp_path, context_base, folder, n_shot=n_shot)), f"save_dir={save_dir}",
                          cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    expected = hand_predictions(reference, mmlu, MMLU_SUBJECTS, n_shot=n_shot, lang="en")
    written = json.loads((save_dir / "results.json").read_text(encoding="utf-8"))
    assert {s: [v[str(i)] for i in range(len(v))] for s, v in written.items()} == expected

    def accuracy(predicted: dict[str, list[str]]) -> dict[str, float]:
        return {subject: float(np.mean([p == row["answer"] for p, row in zip(letters, mmlu[subject]["test"], strict=True)]))
                for subject, letters in predicted.items()}

    by_hand, evaluated = accuracy(expected), accuracy({s: list(v.values()) for s, v in written.items()})
    print(f"n_shot {n_shot}: per-subject accuracy of tuneline eval {evaluated}, by hand from the logits {by_hand}")
    assert evaluated == by_hand
    log = expected_log(expected, mmlu, MMLU_SUBJECTS)
    assert (save_dir / "results.log").read_text(encoding="utf-8") == log
    assert [line.split(":")[0].strip() for line in log.splitlines()] == ["Average", "STEM", "Humanities"]
    assert result.stdout == log + "\n"  # printed as LLaMA-Factory prints it
    # LLaMA-Factory's json.dump(results, f, indent=2): keys "0", "1", ... in order, no newline at the end
    assert (save_dir / "results.json").read_text(encoding="utf-8") == json.dumps(
        {s: {str(i): p for i, p in enumerate(v)} for s, v in expected.items()}, indent=2)
    assert sorted(p.name for p in save_dir.parent.iterdir()) == ["eval"]  # the draft folder was renamed


def test_a_zipped_chinese_benchmark_is_scored_the_same_way(task_dir, reference, context_base, tmp_path):
    folder, _, cmmlu = task_dir
    config = eval_config(tmp_path, context_base, folder, task="cmmlu_test", lang="zh", n_shot=5, seed=7)
    result = run_cli_here("eval", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    expected = hand_predictions(reference, cmmlu, CMMLU_SUBJECTS, n_shot=5, lang="zh", seed=7)
    assert result.stdout == expected_log(expected, cmmlu, CMMLU_SUBJECTS) + "\n"


def test_the_reference_tells_a_wrong_prompt_position_choice_token_or_draw_apart(task_dir, reference):
    """What the acceptance test compares is sensitive, on this data, to each thing it checks."""
    _, mmlu, _ = task_dir
    for n_shot in (0, 5):
        right = hand_predictions(reference, mmlu, MMLU_SUBJECTS, n_shot=n_shot, lang="en")
        assert len({p for v in right.values() for p in v}) == 4
        for wrong in ({"system": False}, {"position": -2}, {"letters": "abcd"}, {"lang": "zh"}):
            assert hand_predictions(reference, mmlu, MMLU_SUBJECTS, n_shot=n_shot, **{"lang": "en", **wrong}) != right, wrong
    assert hand_predictions(reference, mmlu, MMLU_SUBJECTS, n_shot=5, lang="en", seed=0) != right


def test_the_examples_are_the_ones_datasets_unseeded_shuffle_draws_after_seeding(task_dir):
    folder, mmlu, _ = task_dir
    benchmark = read_benchmark(task_dir=folder, task="mmlu_test")
    reference = drawn_examples(mmlu, MMLU_SUBJECTS, n_shot=3, seed=42)
    ours = example_draws(benchmark, n_shot=3, seed=42)
    for subject, draws in zip(benchmark.subjects, ours, strict=True):
        assert [[subject.examples[i].text for i in d] for d in draws] == \
               [[row["question"] for row in shots] for shots in reference[subject.key]]
    assert example_draws(benchmark, n_shot=3, seed=42) == ours != example_draws(benchmark, n_shot=3, seed=43)


# ---------------------------------------------------------------- refusals


def test_an_existing_save_dir_a_bad_row_and_an_unknown_task_exit_2(task_dir, tmp_path):
    folder, _, _ = task_dir
    (tmp_path / "done").mkdir()
    config = str(eval_config(tmp_path, tmp_path / "never-loaded", folder))  # each is refused before a model loads
    assert_refused(run_cli_here("eval", config, f"save_dir={tmp_path / 'done'}", cwd=tmp_path), "'save_dir:", "already exists")
    assert_refused(run_cli_here("eval", config, "task=mmlu", cwd=tmp_path), "'task: mmlu' is not of the form")
    assert_refused(run_cli_here("eval", config, "task=gsm8k_test", cwd=tmp_path), "benchmark 'gsm8k'", "mmlu")

    bad = tmp_path / "bad"
    write_mmlu(bad, folders=("dev", "test"))
    path = bad / "mmlu/data/test/philosophy_test.csv"
    lines = path.read_text(encoding="utf-8").split("\n")  # lines 1-2 are the quoted two-line question
    lines[4] = lines[4].rsplit(",", 1)[0]  # the row on line 5 loses its answer column
    path.write_text("\n".join(lines), encoding="utf-8")
    assert_refused(run_cli_here("eval", config, f"task_dir={bad}", cwd=tmp_path),
                   f"{path}, line 5: 5 columns where the file has 6")


def test_rows_mapping_and_splits_are_checked_naming_the_file_row_or_key(tmp_path):
    write_mmlu(tmp_path, folders=("dev", "test"))
    path = tmp_path / "mmlu/data/dev/college_physics_dev.csv"
    text = path.read_text(encoding="utf-8")
    line = text[:text.index(",B\n")].count("\n") + 1
    path.write_text(text.replace(",B\n", ",E\n", 1), encoding="utf-8")
    mapping = tmp_path / "mmlu/mapping.json"
    mapping.write_text(json.dumps({**json.loads(mapping.read_text()), "virology": {"name": "virology", "category": "Other"}}))
    with pytest.raises(ConfigError) as error:
        read_benchmark(task_dir=tmp_path, task="mmlu_test")
    assert f"{path}, line {line}: the answer 'E' is not one of A, B, C or D" in str(error.value)
    assert "names the subject 'virology', but there is no data/test/virology_test.csv" in str(error.value)
    with pytest.raises(ConfigError, match="needs the validation split, whose files are in data/val/"):
        read_benchmark(task_dir=tmp_path, task="mmlu_validation")
    with pytest.raises(ConfigError, match="cmmlu has no validation split .* use cmmlu_test"):
        read_benchmark(task_dir=tmp_path, task="cmmlu_validation")
    with pytest.raises(ConfigError, match=r"reads the folder .*ceval, which does not exist .* holds mmlu"):
        read_benchmark(task_dir=tmp_path, task="ceval_test")
    mapping.write_text(json.dumps({"virology": {"name": "virology", "category": "Biology"}}))
    with pytest.raises(ConfigError, match="subject 'virology' must be .*Social Sciences"):
        read_benchmark(task_dir=tmp_path, task="mmlu_test")


def test_ceval_reads_from_its_zip_and_its_test_split_has_no_answers(tmp_path):
    written = write_ceval(tmp_path)
    validation = read_benchmark(task_dir=tmp_path, task="ceval_validation")
    law = validation.subjects[0]
    assert (law.key, law.name, law.category, law.answered) == ("law", "法学", "Humanities", True)
    assert [q.answer for q in law.questions] == [r["answer"] for r in written["law"]["val"]]
    assert [q.text for q in law.examples] == [r["question"] for r in written["law"]["dev"]]
    test = read_benchmark(task_dir=tmp_path, task="ceval_test")
    assert not any(s.answered for s in test.subjects) and {q.answer for s in test.subjects for q in s.questions} == {""}
    assert test.subjects[0].questions[0].text == written["law"]["test"][0]["question"]  # the quoted two-line cell
    result = BenchmarkResult("ceval", "test", (SubjectResult("law", "法学", "Humanities", ("A",), ("",)),), answered=False)
    assert result.metrics() == {} and result.score_text() == "        Average: 0.00\n     Humanities: 0.00"


def test_metrics_are_flat_fractions_and_results_never_overwrite(tmp_path):
    result = BenchmarkResult("mmlu", "test", (
        SubjectResult("a", "a", "STEM", ("A", "B", "C", "D"), ("A", "B", "D", "D")),
        SubjectResult("b", "b", "Social Sciences", ("A", "A"), ("B", "A")),
    ), answered=True)
    assert result.metrics() == {"mmlu_accuracy": 4 / 6, "mmlu_stem_accuracy": 0.75, "mmlu_social_sciences_accuracy": 0.5}
    assert result.subject_accuracy() == {"a": 0.75, "b": 0.5}
    assert result.score_text() == "        Average: 66.67\n           STEM: 75.00\nSocial Sciences: 50.00"
    written = write_results(result, tmp_path / "out")
    assert json.loads((written / "results.json").read_text()) == {"a": {"0": "A", "1": "B", "2": "C", "3": "D"},
                                                                 "b": {"0": "A", "1": "A"}}
    with pytest.raises(ConfigError, match="already exists"):
        write_results(result, tmp_path / "out")


def test_eval_keys_are_read_by_eval_and_refused_by_train_naming_tuneline_eval():
    config, problems = read_eval_config({"model_name_or_path": "m", "task": "mmlu_test", "n_shot": 0, "seed": 1,
                                         "adapter_name_or_path": "a", "template": "fewshot", "finetuning_type": "lora"})
    assert problems == [] and (config.benchmark.n_shot, config.benchmark.seed, config.stage.data.template) == (0, 1, "fewshot")
    _, problems = read_eval_config({"task": "mmlu_test", "lang": "fr", "n_shot": -1, "learning_rate": 1e-4})
    assert any("'lang': got 'fr'; choose one of en, zh" in p for p in problems)
    assert any("'n_shot: -1' must be 0 or more" in p for p in problems)
    assert any("'learning_rate' is a trainer argument" in p for p in problems)
    assert any("'model_name_or_path' is required" in p for p in problems)
    _, problems = read_stage_config({"task": "mmlu_test", "n_shot": 3, "download_mode": "force_redownload"})
    [problem] = problems  # one paragraph for the feature, naming each of its keys
    assert "benchmark evaluation" in problem and "`tuneline eval CONFIG.yaml`" in problem
    assert all(key in problem for key in ("'task: mmlu_test'", "'n_shot: 3'", "'download_mode: force_redownload'"))
