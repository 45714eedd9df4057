"""Trainer arguments from LLaMA-Factory keys: `disable_shuffling` as transformers' sequential sampler,
`use_reentrant_gc` as the gradient checkpointing the trainer turns on."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import RandomSampler, SequentialSampler

from tuneline.core.errors import ConfigError
from tuneline.core.training.arguments import training_arguments


def test_disable_shuffling_reads_the_training_rows_in_order(tmp_path: Path) -> None:
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer

    rows = Dataset.from_dict({"input_ids": [[i + 1] * 3 for i in range(6)], "labels": [[i + 1] * 3 for i in range(6)]})
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1))
    seen = {}
    for sequential in (False, True):
        args = training_arguments(str(tmp_path), {"per_device_train_batch_size": 2, "report_to": "none"}, sequential=sequential)
        trainer = Trainer(model=model, args=args, train_dataset=rows)
        seen[sequential] = trainer._get_train_sampler()
        if sequential:
            firsts = [batch["input_ids"][:, 0].tolist() for batch in trainer.get_train_dataloader()]
            assert firsts == [[1, 2], [3, 4], [5, 6]]
    assert isinstance(seen[False], RandomSampler) and isinstance(seen[True], SequentialSampler)


def test_disable_shuffling_with_another_sampling_strategy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'disable_shuffling: true' reads the rows in order, but 'train_sampling_strategy: "
                                          "group_by_length'"):
        training_arguments(str(tmp_path), {"train_sampling_strategy": "group_by_length"}, sequential=True)


@pytest.mark.slow
def test_use_reentrant_gc_chooses_the_checkpointing_the_trainer_turns_on(tmp_path: Path) -> None:
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer

    rows = Dataset.from_dict({"input_ids": [[1, 2, 3]] * 2, "labels": [[1, 2, 3]] * 2})
    for reentrant in (True, False):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                             num_attention_heads=1, num_key_value_heads=1))
        args = training_arguments(str(tmp_path), {"gradient_checkpointing": True, "max_steps": 1, "report_to": "none",
                                                  "use_cpu": True}, use_reentrant_gc=reentrant)
        Trainer(model=model, args=args, train_dataset=rows).train()
        checkpointing = model.model.layers[0]._gradient_checkpointing_func
        assert model.model.layers[0].gradient_checkpointing and checkpointing.keywords == {"use_reentrant": reentrant}
