"""Rows to model inputs: supervised turns with label masks, and packed pretraining blocks.

Token-exact with LLaMA-Factory 0.9.5's supervised and pretraining processors (truncation per
turn, labels -100 on prompts, eos text appended to documents). One deliberate difference: a row
left with no trained token is returned as None instead of being kept.
"""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Any

from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates import Template, encode_turns

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """Lengths that (source, target) keep within a budget of `cutoff_len` tokens.

    A target under half the budget is kept whole and the source cut; else a source under half
    the budget is kept whole and the target cut; else both are cut in proportion to their lengths.
    """
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def _check_row(row: dict[str, Any]) -> None:
    prompt, response = row.get("prompt"), row.get("response")
    if not isinstance(prompt, list) or len(prompt) % 2 != 1:
        raise DataError(
            f"a supervised row needs an odd number of prompt messages ending with user, got {prompt!r}"
        )
    if not isinstance(response, list) or len(response) != 1:
        raise DataError(f"a supervised row needs exactly one response message, got {response!r}")


def _source_labels(
    source_ids: list[int], *, turn_idx: int, template: Template, eos_id: int, train_on_prompt: bool
) -> list[int]:
    if train_on_prompt:
        return list(source_ids)
    if template.efficient_eos and turn_idx != 0 and source_ids:
        # the eos that closes the previous reply is written at the start of this source
        return [eos_id] + [IGNORE_INDEX] * (len(source_ids) - 1)
    return [IGNORE_INDEX] * len(source_ids)


def encode_supervised_row(
    row: dict[str, Any],
    *,
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    cutoff_len: int,
    train_on_prompt: bool = False,
    mask_history: bool = False,
) -> dict[str, list[int]] | None:
    """`input_ids`, `attention_mask` and `labels` of one conversation, or None if nothing is trained.

    Turns are truncated one by one against the remaining budget (`infer_seqlen`); turns after the
    budget runs out are dropped. With `mask_history` turns are taken last-first and only the last
    one is trained.
    """
    if train_on_prompt and template.efficient_eos:
        raise ConfigError(f"train_on_prompt cannot be used with template '{template.name}' (efficient_eos)")
    _check_row(row)
    pairs = encode_turns(
        template,
        tokenizer,
        prompt=row["prompt"],
        response=row["response"],
        system=row.get("system") or None,
        tools=row.get("tools") or None,
    )
    if mask_history:
        pairs = pairs[::-1]  # the last turns have priority
    eos_id = tokenizer.eos_token_id
    total_length = 1 if template.efficient_eos else 0
    input_ids: list[int] = []
    labels: list[int] = []
    for turn_idx, (source_ids, target_ids) in enumerate(pairs):
        if total_length >= cutoff_len:
            break
        source_len, target_len = infer_seqlen(len(source_ids), len(target_ids), cutoff_len - total_length)
        source_ids, target_ids = source_ids[:source_len], target_ids[:target_len]
        total_length += source_len + target_len
        source_labels = _source_labels(
            source_ids, turn_idx=turn_idx, template=template, eos_id=eos_id, train_on_prompt=train_on_prompt
        )
        target_labels = [IGNORE_INDEX] * target_len if mask_history and turn_idx != 0 else list(target_ids)
        if mask_history:
            input_ids = source_ids + target_ids + input_ids
            labels = source_labels + target_labels + labels
        else:
            input_ids += source_ids + target_ids
            labels += source_labels + target_labels
    if template.efficient_eos:
        input_ids.append(eos_id)
        labels.append(eos_id)
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def _adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether encoding with special tokens puts the BOS token first."""
    if tokenizer.bos_token_id is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def encode_pretrain_texts(
    texts: list[str], *, tokenizer: PreTrainedTokenizerBase, template: Template, cutoff_len: int
) -> list[dict[str, list[int]]]:
    """Blocks of exactly `cutoff_len` tokens from one batch of documents (the tail is dropped).

    Each document gets the eos text appended (llama3: `<|end_of_text|>`), the batch is
    concatenated and cut into blocks; a tokenizer that adds BOS gets it written over position 0
    of each block. Labels equal the input ids.
    """
    if cutoff_len < 1:
        raise ConfigError(f"cutoff_len must be at least 1, got {cutoff_len}")
    eos_text = template.pretrain_eos or tokenizer.eos_token
    if eos_text is None:
        raise ConfigError("the tokenizer has no eos token; call fix_tokenizer(template, tokenizer) first")
    encoded = tokenizer([text + eos_text for text in texts], add_special_tokens=False)["input_ids"]
    stream = list(chain.from_iterable(encoded))
    total = len(stream) // cutoff_len * cutoff_len
    blocks = [stream[i : i + cutoff_len] for i in range(0, total, cutoff_len)]
    if _adds_bos(tokenizer):
        for block in blocks:
            block[0] = tokenizer.bos_token_id
    return [{"input_ids": b, "attention_mask": [1] * len(b), "labels": list(b)} for b in blocks]
