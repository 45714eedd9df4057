"""Stage kto's KL term on two rows: each row's mismatched sequence is paired when tokenizing (its
prompt with the other row's reply) and is what TRL's KTO loss measures, in a batch of one row too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tuneline.core.stages.kind import TrainerRequest
from tuneline.core.stages.registry import build_stage_config

ROWS = [
    {"instruction": "Tell me the opposite of win.", "input": "", "output": "The opposite of win is lose.", "kto_tag": True},
    {"instruction": "Answer the question.", "input": "What is the plural of lady?", "output": "The plural of lady is cats.",
     "kto_tag": False},
]
COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "kto_tag": "kto_tag"}


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    yield


def tokenize(base: Path, folder: Path, rows: list[dict]) -> tuple:
    """(train split, tokenizer) of `rows` tokenized for stage kto."""
    from datasets import load_from_disk

    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.stages.registry import tokenize_stage_data

    folder.mkdir()
    (folder / "rows.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.json", "columns": COLUMNS}}))
    config = build_stage_config({"model_name_or_path": str(base), "stage": "kto", "dataset": "rows",
                                 "dataset_dir": str(folder), "template": "chatml", "cutoff_len": 64})
    tokenize_stage_data(config, tokenizer_path=base, output_dir=folder / "tokenized")
    return load_from_disk(str(folder / "tokenized"))["train"], load_tokenizer(folder / "tokenized" / "tokenizer")


def reply_logp(model, input_ids: list[int], labels: list[int]) -> torch.Tensor:
    """Summed log-probability of the trained tokens of one sequence, from the model's logits."""
    ids, targets = torch.tensor([input_ids]), torch.tensor(labels[1:])
    with torch.no_grad():
        log_probs = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    trained = targets != -100
    return log_probs[trained].gather(-1, targets[trained][:, None]).sum()


def test_kl_term_pairs_each_prompt_with_the_other_reply_and_enters_the_loss(tiny_base: Path, tmp_path: Path) -> None:
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.kto import build_kto_trainer
    from tuneline.core.training.arguments import training_arguments

    rows, tokenizer = tokenize(tiny_base, tmp_path / "rows", ROWS)
    # The KL sequence of row i is row i's prompt with row i-1's reply (row 0 takes the last reply),
    # tokenized as if that reply were its own.
    swapped = [{**ROWS[0], "output": ROWS[1]["output"]}, {**ROWS[1], "output": ROWS[0]["output"]}]
    expected, _ = tokenize(tiny_base, tmp_path / "swapped", swapped)
    assert rows["kl_input_ids"] == expected["input_ids"] and rows["kl_labels"] == expected["labels"]
    assert rows["kto_tags"] == [True, False]

    method = build_stage_config({"stage": "kto", "finetuning_type": "full"}).finetuning
    args = training_arguments(str(tmp_path / "run"), {"per_device_train_batch_size": 1, "report_to": "none"})
    trainer = build_kto_trainer(TrainerRequest(model=apply_finetuning(load_model(tiny_base, vocab_size=len(tokenizer)), method),
                                               tokenizer=tokenizer, train_dataset=rows, finetuning=method, args=args))
    policy, reference = trainer.model, trainer.ref_model
    assert len(next(iter(trainer.get_train_dataloader()))["label"]) == 1
    # Move the policy towards the mismatched replies, so that its KL estimate against the reference is positive.
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    for _ in range(5):
        for ids, labels in zip(rows["kl_input_ids"], rows["kl_labels"]):
            policy(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    policy.eval()

    def ratio(prefix: str, i: int) -> float:
        ids, labels = rows[i][f"{prefix}input_ids"], rows[i][f"{prefix}labels"]
        return (reply_logp(policy, ids, labels) - reply_logp(reference, ids, labels)).item()

    beta = method.pref_beta
    kl_both = max((ratio("kl_", 0) + ratio("kl_", 1)) / 2, 0.0)
    assert kl_both > 0.1
    desired = 1 - torch.sigmoid(torch.tensor(beta * (ratio("", 0) - kl_both)))
    undesired = 1 - torch.sigmoid(torch.tensor(beta * (kl_both - ratio("", 1))))
    expected_loss = (method.kto_chosen_weight * desired + method.kto_rejected_weight * undesired).item() / 2

    with torch.no_grad():
        loss = trainer.compute_loss(policy, trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]]))
        assert trainer._metrics["eval"]["kl"][-1] == pytest.approx(kl_both, rel=1e-4)
        assert loss.item() == pytest.approx(expected_loss, rel=1e-4)
        trainer.compute_loss(policy, trainer.data_collator([trainer.train_dataset[0]]))  # a batch of one row
        assert trainer._metrics["eval"]["kl"][-1] == pytest.approx(max(ratio("kl_", 0), 0.0), rel=1e-4)
