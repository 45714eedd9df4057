"""TRL's preference trainers on datasets that tuneline has already tokenized.

Each subclass overrides only the hook that would tokenize the rows again (TRL's preprocessing
starts from text); the rows come from `core.alignment_data` in the shape TRL documents for
processed datasets. Imported lazily by `core.preference`, since loading TRL's trainers takes seconds.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any

from accelerate.utils import is_peft_model
from torch.utils.data import RandomSampler, Sampler, SequentialSampler
from trl import DPOTrainer, KTOTrainer
from trl.import_utils import TRLExperimentalWarning
from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

from tuneline.core.training.full_logits_head import prefer_full_logits

with warnings.catch_warnings():
    # ORPO and CPO (SimPO) live in trl.experimental, which warns on import; tuneline pins its TRL
    # version and its tests train both, so the notice would only alarm users.
    warnings.simplefilter("ignore", TRLExperimentalWarning)
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer


class TokenizedDPOTrainer(DPOTrainer):
    """DPO (sigmoid, hinge, ipo, robust) on `alignment_data.dpo_pairs` rows."""

    def __init__(self, *args: Any, media_rows: Any = None, **trainer_arguments: Any) -> None:
        super().__init__(*args, **trainer_arguments)
        if not self.use_weighting:  # WPO's weights need a field only TRL's head computes
            _score_from_full_logits(self, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
        if media_rows is not None:  # pairs of media rows: their pixels are cut per batch
            from tuneline.core.data.media.batching import PairedMediaCollator

            self.data_collator = PairedMediaCollator(self.data_collator, media_rows, token_ids=media_rows.token_ids(self.processing_class))

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        return dataset


class TokenizedKTOTrainer(KTOTrainer):
    """KTO on `alignment_data.kto_examples` rows, whose KL sequences were paired at preprocessing.

    Each row brings its own mismatched sequence for the KL term (its prompt with another row's
    reply), so a batch of one row has a KL term too, computed from exactly the tokens tuneline wrote.
    """

    shuffle: bool = True  # False for `disable_shuffling`, set by `kto.build_kto_trainer`

    def __init__(self, *, args: Any, media_rows: Any = None, **trainer_arguments: Any) -> None:
        # TRL refuses a batch of one row because it builds the KL completions from the batch's other
        # rows; here they come with the rows, so its check is passed two rows and then given the real batch.
        rows = args.per_device_train_batch_size
        args.per_device_train_batch_size = max(rows, 2)
        try:
            super().__init__(args=args, **trainer_arguments)
        finally:
            args.per_device_train_batch_size = rows
        self._train_batch_size = args.train_batch_size
        _score_from_full_logits(self, outputs=("log_probs", "entropy", "mean_logits"))
        collator = self.data_collator
        self.data_collator = OwnKLPromptCollator(pad_token_id=collator.pad_token_id, max_length=collator.max_length,
                                                 pad_to_multiple_of=collator.pad_to_multiple_of)
        if media_rows is not None:  # media rows: their pixels are cut per batch, for both sequences of each example
            from tuneline.core.data.media.batching import FeedbackMediaCollator

            self.data_collator = FeedbackMediaCollator(self.data_collator, media_rows,
                                                       token_ids=media_rows.token_ids(self.processing_class))

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        return dataset

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        if "KL_prompt_ids" not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, "KL_prompt_ids"]

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler | None:
        """Shuffled batches, as LLaMA-Factory trains KTO. TRL keeps the rows in order only because it
        pairs each completion with a neighbour in the batch for the KL term; tuneline's rows bring
        their KL sequence with them. In order when `shuffle` is off (`disable_shuffling`); the
        arguments always say sequential, which TRL insists on."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return RandomSampler(dataset) if self.shuffle else SequentialSampler(dataset)


def _score_from_full_logits(trainer: DPOTrainer | KTOTrainer, *, outputs: tuple[str, ...]) -> None:
    """`full_logits_head.prefer_full_logits` on the policy and the reference model, given the fields
    the trainer asked TRL's fused head for (the reference is asked for log-probabilities alone)."""
    policy = trainer.model.get_base_model() if is_peft_model(trainer.model) else trainer.model
    prefer_full_logits(policy, outputs=outputs)
    if trainer.ref_model is not None:
        prefer_full_logits(trainer.accelerator.unwrap_model(trainer.ref_model), outputs=("log_probs",))


class OwnKLPromptCollator(DataCollatorForUnpairedPreference):
    """TRL's KTO collator, with each KL sequence built from its own tokenized prompt (`KL_prompt_ids`)
    rather than the example's: the two differ where cutoff_len cut the prompt to fit a longer or
    shorter reply."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        own = [{key: value for key, value in example.items() if not key.startswith("KL_")} for example in examples]
        output = super().torch_call(own)
        mismatched = super().torch_call([{"prompt_ids": example["KL_prompt_ids"], "completion_ids": example["KL_completion_ids"],
                                          "label": example["label"]} for example in examples])
        output.update({f"KL_{key}": mismatched[key] for key in ("input_ids", "attention_mask", "completion_mask")})
        return output


class OnTokenizedPairs:
    """The hooks TRL's ORPO and CPO trainers share, made to read `alignment_data.odds_ratio_pairs` rows
    (LLaMA-Factory's column names, which both read) as they are; pairs of media rows get their pixels
    in the concatenated pass. Listed first among a trainer's bases, so its hooks replace TRL's."""

    def __init__(self, *args: Any, media_rows: Any = None, **trainer_arguments: Any) -> None:
        super().__init__(*args, **trainer_arguments)
        self.pair_media = _pair_media(media_rows, self.processing_class)

    def tokenize_row(self, feature: dict[str, Any], model: Any = None) -> dict[str, Any]:
        return feature

    def concatenated_forward(self, model: Any, batch: dict[str, Any]) -> Any:
        with self.pair_media.feeding(model, batch) if self.pair_media else nullcontext():
            return super().concatenated_forward(model, batch)


class TokenizedORPOTrainer(OnTokenizedPairs, ORPOTrainer):
    """ORPO on tokenized pairs."""


class TokenizedCPOTrainer(OnTokenizedPairs, CPOTrainer):
    """CPO with SimPO's loss on tokenized pairs."""


def _pair_media(media_rows: Any, tokenizer: Any) -> Any:
    if media_rows is None:
        return None
    from tuneline.core.data.media.batching import ConcatenatedPairMedia

    return ConcatenatedPairMedia(media_rows, token_ids=media_rows.token_ids(tokenizer))
