"""TRL's online RL trainers (GRPO, RLOO) on prompts tuneline's template rendered.

TRL renders each prompt itself, with the tokenizer's chat template; tuneline's prompts are already
token ids, written by the stage's template exactly as sft wrote them, so generation must start from
those ids. The trainers here take them from the batch's `prompt_ids` column in place of TRL's
rendering (`_tokenize_prompts`), and otherwise run TRL's own sampling, rewards, advantages and losses.

They also bring what the stage needs around TRL: the reference model tuneline loads (a full or freeze
policy's frozen copy, or `ref_model`) instead of TRL loading the policy's folder a second time by
name; the held-out scores of the starting policy, taken before the first step; and a sample of each
logged step's completions written to `completions.jsonl` for the MLflow table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from trl import GRPOTrainer, RLOOTrainer
from trl.trainer.utils import RepeatSampler

from tuneline.core.training.completions_log import append_completions

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

COMPLETIONS_PER_LOG = 16  # completions of each logged step kept for the table


def prompt_rows(dataset: Dataset, tokenizer: PreTrainedTokenizerBase) -> Dataset:
    """Tokenized prompt rows (`input_ids` ending with the assistant's turn, the reference reply as
    `labels`) as the online trainers read them: `prompt` (the rendered prompt's text, for reward
    functions and logs), `prompt_ids` (what generation starts from) and `answer` (the reference reply's
    text without the template's special tokens, which the verifiable rewards compare against)."""

    def convert(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {
            "prompt": tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=False, clean_up_tokenization_spaces=False),
            "prompt_ids": batch["input_ids"],
            "answer": [text.strip() for text in tokenizer.batch_decode(batch["labels"], skip_special_tokens=True,
                                                                       clean_up_tokenization_spaces=False)],
        }

    return dataset.map(convert, batched=True, remove_columns=dataset.column_names, desc="prompts")


class TemplatePromptsMixin:
    """What GRPO and RLOO share here; see the module docstring."""

    def __init__(self, *, reference: PreTrainedModel | None = None, held_out: Any = None, **kwargs: Any) -> None:
        from trl.trainer.utils import add_fused_lm_head

        args = kwargs["args"]
        beta = args.beta
        own_reference = beta != 0.0 and reference is not None
        if own_reference:
            args.beta = 0.0  # keeps TRL from loading the policy's folder again as its reference
        self._prompt_ids: list[list[int]] | None = None
        self.held_out = held_out
        self.start_scores: dict[str, float] = {}
        self._sampled_step = -1
        super().__init__(**kwargs)
        if own_reference:
            args.beta = self.beta = beta
            reference.requires_grad_(False)
            add_fused_lm_head(reference, temperature=self.temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32)
            self.ref_model = self.accelerator.prepare_model(reference.eval(), evaluation_mode=True)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._prompt_ids = [list(row["prompt_ids"]) for row in inputs]
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._prompt_ids = None

    def _tokenize_prompts(self, prompts: list[Any]) -> tuple[list[list[int]], None, dict[str, Any]]:
        if self._prompt_ids is None or len(self._prompt_ids) != len(prompts):
            raise RuntimeError("the online RL trainer was asked to render prompts outside a batch of tokenized rows")
        return self._prompt_ids, None, {}

    def _get_train_sampler(self, dataset: Any = None) -> RepeatSampler:
        sampler = super()._get_train_sampler(dataset)
        resumable = EpochRepeatSampler.__new__(EpochRepeatSampler)
        resumable.__dict__.update(sampler.__dict__)
        return resumable

    def train(self, *args: Any, **kwargs: Any) -> Any:
        if self.held_out is not None:  # the policy is still the starting one: checkpoints load inside train()
            self.start_scores = self.held_out(self)
        return super().train(*args, **kwargs)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # once per step: the end-of-training summary is logged at the last step again
        fresh = self.model.training and self.state.global_step != self._sampled_step
        sample = self._completions_sample() if fresh and self.accelerator.is_main_process else []
        self._sampled_step = self.state.global_step if fresh else self._sampled_step
        super().log(logs, start_time)
        if sample:
            append_completions(self.args.output_dir, sample)

    def _completions_sample(self) -> list[dict[str, Any]]:
        """The last generation batch's first completions, one row each: step, prompt, completion, each
        reward and the advantage."""
        logs = self._logs
        count = min(len(logs["prompt"]), COMPLETIONS_PER_LOG)
        start = len(logs["prompt"]) - count
        rows = []
        for index in range(start, start + count):
            row = {"step": self.state.global_step, "prompt": logs["prompt"][index], "completion": logs["completion"][index]}
            row.update({f"reward_{name}": values[index] for name, values in logs["rewards"].items() if index < len(values)})
            if index < len(logs["advantages"]):
                row["advantage"] = logs["advantages"][index]
            rows.append(row)
        return rows


class EpochRepeatSampler(RepeatSampler):
    """TRL's sampler, whose shuffled order of each epoch is a function of the epoch.

    TRL's draws one permutation per epoch from a generator it seeds once, so a run resumed in its
    third epoch would read the first epoch's order again. The Trainer calls `set_epoch` before each
    epoch: the generator is seeded anew and advanced past the earlier epochs' permutations, which gives
    an uninterrupted run's orders, resumed or not.
    """

    def set_epoch(self, epoch: int) -> None:
        if not self.shuffle or self.seed is None:
            return
        self.generator.manual_seed(self.seed)
        for _ in range(epoch):
            torch.randperm(self.num_samples, generator=self.generator)


class TokenizedGRPOTrainer(TemplatePromptsMixin, GRPOTrainer):
    """TRL's GRPOTrainer on tuneline's tokenized prompts."""


class TokenizedRLOOTrainer(TemplatePromptsMixin, RLOOTrainer):
    """TRL's RLOOTrainer on tuneline's tokenized prompts."""
