"""TRL's preference trainers on datasets that tuneline has already tokenized.

Each subclass overrides only the hook that would tokenize the rows again (TRL's preprocessing
starts from text); the rows come from `core.alignment_data` in the shape TRL documents for
processed datasets. Imported lazily by `core.preference`, since loading TRL's trainers takes seconds.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.utils.data import RandomSampler, Sampler, SequentialSampler
from trl import DPOTrainer, KTOTrainer
from trl.import_utils import TRLExperimentalWarning

with warnings.catch_warnings():
    # ORPO and CPO (SimPO) live in trl.experimental, which warns on import; tuneline pins its TRL
    # version and its tests train both, so the notice would only alarm users.
    warnings.simplefilter("ignore", TRLExperimentalWarning)
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer


class TokenizedDPOTrainer(DPOTrainer):
    """DPO (sigmoid, hinge, ipo, robust) on `alignment_data.dpo_pairs` rows."""

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        return dataset


class TokenizedKTOTrainer(KTOTrainer):
    """KTO on `alignment_data.kto_examples` rows, whose KL completions were paired at preprocessing."""

    shuffle: bool = True  # False for `disable_shuffling`, set by `kto.build_kto_trainer`

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        return dataset

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler | None:
        """Shuffled batches, as LLaMA-Factory trains KTO. TRL keeps the rows in order only because it
        pairs each completion with a neighbour in the batch for the KL term; tuneline's rows bring
        their KL completion with them. In order when `shuffle` is off (`disable_shuffling`); the
        arguments always say sequential, which TRL insists on."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return RandomSampler(dataset) if self.shuffle else SequentialSampler(dataset)


class TokenizedORPOTrainer(ORPOTrainer):
    """ORPO on `alignment_data.odds_ratio_pairs` rows (LLaMA-Factory's column names, which ORPO reads)."""

    def tokenize_row(self, feature: dict[str, Any], model: Any = None) -> dict[str, Any]:
        return feature


class TokenizedCPOTrainer(CPOTrainer):
    """CPO with SimPO's loss on `alignment_data.odds_ratio_pairs` rows."""

    def tokenize_row(self, feature: dict[str, Any], model: Any = None) -> dict[str, Any]:
        return feature
