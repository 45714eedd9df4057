"""LLaMA-Factory's multiple-choice benchmark evaluation (`llamafactory-cli eval`) on MMLU, CMMLU and C-Eval.

    tuneline eval CONFIG.yaml [key=value ...]

Each question of the task's split becomes a conversation as LLaMA-Factory's eval template writes it:
`n_shot` solved examples of the subject's dev split (the question, its four choices and the answer cue
as a user turn, the answer letter as the assistant turn), then the question itself, with the
subject's instruction line in front of the first user message. The stage's template encodes it with
everything before the last answer as the prompt (`encode_oneturn`); among the tokens of A, B, C and D,
the model's likeliest at the prompt's last position is the prediction. Accuracy per subject, per
category and over all questions ("Average"); `results.json` and `results.log` are written into
`save_dir` as LLaMA-Factory writes them.

`evaluate_benchmark` is the library call (a loaded model and tokenizer in, a `BenchmarkResult` out);
`run_benchmark` is the command's: read the benchmark, load the model the config names, score, write.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from tuneline.core.config.benchmark import EvalConfig, save_dir_exists_message
from tuneline.core.errors import ConfigError
from tuneline.core.evaluation.benchmark_data import CATEGORIES, CHOICES, Benchmark, Question, Subject, read_benchmark
from tuneline.core.templates.conversation import Conversation, encode_oneturn

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tuneline.core.config import StageConfig
    from tuneline.core.templates.spec import Template

AVERAGE = "Average"
Language = Literal["en", "zh"]
RESULTS_JSON, RESULTS_LOG = "results.json", "results.log"


@dataclass(frozen=True)
class EvalTemplate:
    """The texts around a question (LLaMA-Factory's `eval/template.py`)."""

    system: str  # formatted with `subject`, put in front of the first user message
    choice: str  # formatted with `choice` (the letter) and `content`, once per choice
    answer: str  # the cue after the choices


EVAL_TEMPLATES: dict[str, EvalTemplate] = {
    "en": EvalTemplate(system="The following are multiple choice questions (with answers) about {subject}.\n\n",
                       choice="\n{choice}. {content}", answer="\nAnswer:"),
    "zh": EvalTemplate(system="以下是中国关于{subject}考试的单项选择题，请选出其中的正确答案。\n\n",
                       choice="\n{choice}. {content}", answer="\n答案："),
}


@dataclass(frozen=True)
class SubjectResult:
    subject: str
    name: str
    category: str
    predictions: tuple[str, ...]  # a letter per question, in the file's order
    answers: tuple[str, ...]  # "" where the file holds no answers

    @property
    def correct(self) -> int:
        return sum(p == a for p, a in zip(self.predictions, self.answers, strict=True))

    @property
    def accuracy(self) -> float:
        """Fraction right (NaN for a subject without questions)."""
        return self.correct / len(self.answers) if self.answers else math.nan


@dataclass(frozen=True)
class BenchmarkResult:
    """Predictions and accuracies of one benchmark split; LLaMA-Factory's files and MLflow's metrics from them."""

    benchmark: str  # mmlu, cmmlu or ceval
    split: str
    subjects: tuple[SubjectResult, ...]  # in mapping.json's order
    answered: bool  # every evaluated file held answers (C-Eval's test files hold none)

    def subject_accuracy(self) -> dict[str, float]:
        return {s.subject: s.accuracy for s in self.subjects}

    def category_accuracy(self) -> dict[str, float]:
        """"Average" over all questions, then each category that has questions, in LLaMA-Factory's order."""
        accuracy = {}
        for category in (AVERAGE, *CATEGORIES):
            members = [s for s in self.subjects if category in (AVERAGE, s.category)]
            total = sum(len(s.answers) for s in members)
            if total:
                accuracy[category] = sum(s.correct for s in members) / total
        return accuracy

    def predictions(self) -> dict[str, dict[str, str]]:
        """results.json's content: {subject: {"0": "B", ...}}."""
        return {s.subject: {str(i): letter for i, letter in enumerate(s.predictions)} for s in self.subjects}

    def score_text(self) -> str:
        """results.log's content, which the command also prints: `{category:>15}: {percent:.2f}` lines."""
        return "\n".join(f"{category:>15}: {100 * value:.2f}" for category, value in self.category_accuracy().items())

    def metrics(self) -> dict[str, float]:
        """Flat MLflow-safe names, fractions 0..1: `{benchmark}_accuracy` (Average) and
        `{benchmark}_{category}_accuracy` (`mmlu_social_sciences_accuracy`); none where the split's
        files hold no answers, since nothing was measured."""
        if not self.answered:
            return {}
        return {f"{self.benchmark}_{'' if category == AVERAGE else _snake(category) + '_'}accuracy": value
                for category, value in self.category_accuracy().items()}


def _snake(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


# ---------------------------------------------------------------- prompts


def question_prompt(question: Question, eval_template: EvalTemplate) -> str:
    """The question, its choices and the answer cue, as one user message."""
    choices = "".join(eval_template.choice.format(choice=letter, content=text)
                      for letter, text in zip(CHOICES, question.choices, strict=True))
    return question.text + choices + eval_template.answer


def question_messages(question: Question, examples: Sequence[Question], *, subject_name: str,
                      eval_template: EvalTemplate) -> list[dict[str, str]]:
    """The examples and the question as user/assistant turns, the instruction line opening the first;
    the last assistant turn is the question's answer, which the encoder leaves out of the prompt."""
    messages = []
    for shown in (*examples, question):
        messages.append({"role": "user", "content": question_prompt(shown, eval_template)})
        messages.append({"role": "assistant", "content": shown.answer})
    messages[0]["content"] = eval_template.system.format(subject=subject_name) + messages[0]["content"]
    return messages


def example_draws(benchmark: Benchmark, *, n_shot: int, seed: int) -> list[list[list[int]]]:
    """For each subject and each of its questions, the dev-split indices of its n-shot examples.

    LLaMA-Factory draws them anew for each question with an unseeded `dataset["train"].shuffle()`,
    keeping the first `n_shot`. Unseeded, datasets' shuffle takes its seed from numpy's global
    generator, which LLaMA-Factory seeds with `seed` at start (`transformers.set_seed`). Here a
    generator of our own is seeded with `seed` and drawn from the same way, subject after subject in
    mapping.json's order, so the examples are fixed by `seed`: the ones LLaMA-Factory 0.9.5 draws with
    that seed, as long as nothing else in its process draws from numpy's global generator meanwhile.
    """
    state = np.random.RandomState(seed)
    return [[_unseeded_shuffle(state, len(subject.examples))[:n_shot] for _ in subject.questions]
            for subject in benchmark.subjects]


def _unseeded_shuffle(state: np.random.RandomState, size: int) -> list[int]:
    """datasets' `Dataset.shuffle()` without a seed: a seed read from the generator's state, then one
    draw from it, then a permutation by a new generator with that seed."""
    _, keys, position, *_ = state.get_state()
    seed = keys[position] if position < len(keys) else keys[0]
    state.random_sample()
    return np.random.default_rng(seed).permutation(size).tolist()


def subject_prompts(tokenizer: PreTrainedTokenizerBase, subject: Subject, draws: Sequence[Sequence[int]], *,
                    template: Template, eval_template: EvalTemplate) -> list[list[int]]:
    """Each question's prompt ids: its conversation encoded up to the answer."""
    prompts = []
    for index, question in enumerate(subject.questions):
        examples = [subject.examples[i] for i in draws[index]] if draws else []
        messages = question_messages(question, examples, subject_name=subject.name, eval_template=eval_template)
        prompt, _ = encode_oneturn(template, tokenizer, Conversation(prompt=messages[:-1], response=messages[-1:]))
        prompts.append(prompt)
    return prompts


# ---------------------------------------------------------------- scoring


def choice_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The token of each letter, as LLaMA-Factory takes it: the last of the letter's encoding."""
    return [tokenizer.encode(letter, add_special_tokens=False)[-1] for letter in CHOICES]


def predict_letters(model: PreTrainedModel, prompts: Sequence[Sequence[int]], *, choice_ids: Sequence[int],
                    batch_size: int, pad_id: int) -> list[str]:
    """The likeliest letter after each prompt: batches padded on the right, each row's logits read at
    its own last prompt position, restricted to the choices' tokens."""
    import torch

    letters: list[str] = []
    choices = torch.tensor(list(choice_ids), device=model.device)
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start:start + batch_size]
            ids = torch.full((len(batch), max(map(len, batch))), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, prompt in enumerate(batch):
                ids[row, :len(prompt)] = torch.tensor(prompt)
                mask[row, :len(prompt)] = 1
            logits = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits
            last = (mask.sum(dim=1) - 1).to(model.device)
            scores = logits[torch.arange(len(batch), device=model.device), last][:, choices]
            letters.extend(CHOICES[i] for i in scores.argmax(dim=-1).tolist())
    return letters


def score_benchmark(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, benchmark: Benchmark, *,
                    template: Template, lang: Language, n_shot: int, batch_size: int, seed: int) -> BenchmarkResult:
    """Every question of `benchmark` answered by `model` (put in eval mode), subject by subject; the
    examples of each are drawn as `example_draws` says. Batches never mix subjects, as in LLaMA-Factory."""
    model.eval()
    eval_template = EVAL_TEMPLATES[lang]
    draws = example_draws(benchmark, n_shot=n_shot, seed=seed) if n_shot > 0 else [[] for _ in benchmark.subjects]
    choice_ids = choice_token_ids(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    results = []
    for subject, subject_draws in zip(benchmark.subjects, draws, strict=True):
        prompts = subject_prompts(tokenizer, subject, subject_draws, template=template, eval_template=eval_template)
        letters = predict_letters(model, prompts, choice_ids=choice_ids, batch_size=batch_size, pad_id=pad_id)
        results.append(SubjectResult(subject=subject.key, name=subject.name, category=subject.category,
                                     predictions=tuple(letters), answers=tuple(q.answer for q in subject.questions)))
    return BenchmarkResult(benchmark=benchmark.name, split=benchmark.split, subjects=tuple(results),
                           answered=all(s.answered for s in benchmark.subjects))


def evaluate_benchmark(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, template: Template,
                       task_dir: str | Path, task: str, lang: Language = "en", n_shot: int = 5, batch_size: int = 4,
                       seed: int = 42) -> BenchmarkResult:
    """`task` (such as mmlu_test) of the benchmarks under `task_dir`, answered by a loaded model.

    `tokenizer` is prepared for `template` (the stage's template, as `stage_template` gives it, and
    the tokenizer its tokenized data saved); LLaMA-Factory's defaults for the other keys. Nothing is
    written: `write_results` writes LLaMA-Factory's files, `BenchmarkResult.metrics()` gives MLflow's.
    """
    problems = argument_problems(lang=lang, n_shot=n_shot, batch_size=batch_size)
    if problems:
        raise ConfigError(problems)
    benchmark = read_benchmark(task_dir=task_dir, task=task, with_examples=n_shot > 0)
    return score_benchmark(model, tokenizer, benchmark, template=template, lang=lang, n_shot=n_shot,
                           batch_size=batch_size, seed=seed)


def argument_problems(*, lang: str, n_shot: int, batch_size: int) -> list[str]:
    problems = []
    if lang not in EVAL_TEMPLATES:
        problems.append(f"'lang: {lang}' has no eval template; choose one of {', '.join(EVAL_TEMPLATES)}.")
    if n_shot < 0:
        problems.append(f"'n_shot: {n_shot}' must be 0 or more.")
    if batch_size < 1:
        problems.append(f"'batch_size: {batch_size}' must be 1 or more.")
    return problems


# ---------------------------------------------------------------- the command


def write_results(result: BenchmarkResult, save_dir: str | Path) -> Path:
    """results.json and results.log as LLaMA-Factory writes them, in a temporary sibling folder renamed
    to `save_dir`, which must not exist (LLaMA-Factory never writes into an existing save_dir)."""
    target = Path(save_dir)
    if target.exists():
        raise ConfigError(save_dir_exists_message(save_dir))
    target.parent.mkdir(parents=True, exist_ok=True)
    draft = target.with_name(f".{target.name}.partial")
    shutil.rmtree(draft, ignore_errors=True)  # our own, left by a killed run
    draft.mkdir()
    (draft / RESULTS_JSON).write_text(json.dumps(result.predictions(), indent=2), encoding="utf-8", newline="\n")
    (draft / RESULTS_LOG).write_text(result.score_text(), encoding="utf-8", newline="\n")
    draft.rename(target)
    return target


def load_evaluated_model(stage: StageConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Template]:
    """The model `model_name_or_path` names, in eval mode (on the GPU when there is one), with the
    adapters of `adapter_name_or_path` merged (a quantized base keeps its one adapter beside it), as
    prediction loads it; its tokenizer prepared for the template as a stage prepares it; the template.
    `infer_dtype` chooses the weights' dtype ('auto': as the model was saved, float32 on a CPU)."""
    import torch

    from tuneline.core.data.tokenization import prepare_tokenizer
    from tuneline.core.models.adapters import adapter_paths, with_adapters
    from tuneline.core.models.loading import load_model, method_problems

    problems = method_problems(stage.model, stage.finetuning)
    if problems:
        raise ConfigError(problems)
    path = stage.model.model_name_or_path
    assert path is not None  # required by the config
    adapters = adapter_paths(stage.model)
    # an adapter saved with its tokenizer holds the tokens its training added (the embeddings grew by them)
    saved = [a for a in adapters if (Path(a) / "tokenizer_config.json").is_file()]
    prepared = prepare_tokenizer(stage, saved[-1] if saved else path)
    dtype = stage.inference.infer_dtype
    precision = {"bfloat16": {"bf16": True}, "float16": {"fp16": True}}.get(dtype, {})
    model = load_model(path, model=stage.model, vocab_size=len(prepared.tokenizer), training=precision)
    quantized = getattr(model, "hf_quantizer", None) is not None  # placed on its device already
    model = with_adapters(model, stage.model)
    if not quantized and dtype == "float32":
        model = model.float()
    if not quantized and torch.cuda.is_available():
        model = model.to("cuda")
    return model.eval(), prepared.tokenizer, prepared.template


def run_benchmark(config: EvalConfig) -> BenchmarkResult:
    """`tuneline eval`: the benchmark read and checked before the model loads, then scored, then
    written to `save_dir` when set."""
    keys = config.benchmark
    assert keys.task is not None  # required by the config
    benchmark = read_benchmark(task_dir=keys.task_dir, task=keys.task, with_examples=keys.n_shot > 0)
    model, tokenizer, template = load_evaluated_model(config.stage)
    result = score_benchmark(model, tokenizer, benchmark, template=template, lang=keys.lang, n_shot=keys.n_shot,
                             batch_size=keys.batch_size, seed=keys.seed)
    if keys.save_dir:
        write_results(result, keys.save_dir)
    return result
