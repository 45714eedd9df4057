"""Rows to model inputs: supervised, pairwise, unsupervised and feedback (KTO) examples, and
pretraining blocks.

Token-exact with LLaMA-Factory 0.9.5's processors (truncation per turn or per prompt/response,
labels -100 on prompts, eos text appended to documents). Deliberate differences: a malformed row
raises `DataError` instead of being dropped silently, and a row left with nothing to train is
returned as None instead of being kept. SFT packing is in `tuneline.core.data.packing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import TYPE_CHECKING, Any

from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates.conversation import Conversation, Template, encode_oneturn, encode_turns

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100
PREPROCESSING_BATCH_SIZE = 1000
"""Rows per preprocessing batch, LLaMA-Factory's `preprocessing_batch_size`: pretraining blocks,
SFT packs and KTO's mismatched pairs are formed within a batch, never across two."""

Message = dict[str, str]
_RESPONSE_SHAPES = {
    "supervised": (1, "exactly one response message (alpaca: the entry's \"response\" column; sharegpt: the "
                      "conversation's last assistant message)"),
    "pairwise": (2, "exactly two response messages, [chosen, rejected] (the entry's \"chosen\" and \"rejected\" "
                    "columns, with \"ranking\": true)"),
    "feedback": (1, "exactly one response message and a boolean 'kto_tag' (the entry's \"kto_tag\" column)"),
}


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


def _check_prompt(row: dict[str, Any], *, kind: str) -> None:
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or len(prompt) % 2 != 1:
        raise DataError(f"a {kind} row needs an odd number of prompt messages ending with user, got {prompt!r}")


def _check_row(row: dict[str, Any], *, kind: str = "supervised") -> None:
    _check_prompt(row, kind=kind)
    count, shape = _RESPONSE_SHAPES[kind]
    response = row.get("response")
    if not isinstance(response, list) or len(response) != count:
        got = f"{len(response)}: {response!r:.200}" if isinstance(response, list) and response else "none"
        raise DataError(f"a {kind} row needs {shape}, got {got}")
    if kind == "feedback" and not isinstance(row.get("kto_tag"), bool):
        raise DataError(f"a feedback row needs {shape}, got kto_tag {row.get('kto_tag')!r}")


@dataclass(frozen=True)
class RowEncoding:
    """What the row encoders need besides the tokenizer: the template, the token budget of an
    example, and which tokens train (supervised rows only)."""

    template: Template
    cutoff_len: int
    train_on_prompt: bool = False  # prompt tokens train too
    mask_history: bool = False  # only the last turn trains; the last turns keep the budget


def _source_labels(source_ids: list[int], *, turn_idx: int, encoding: RowEncoding, eos_id: int) -> list[int]:
    if encoding.train_on_prompt:
        return list(source_ids)
    if encoding.template.efficient_eos and turn_idx != 0 and source_ids:
        # the eos that closes the previous reply is written at the start of this source
        return [eos_id] + [IGNORE_INDEX] * (len(source_ids) - 1)
    return [IGNORE_INDEX] * len(source_ids)


def image_prefix_ids(row: dict[str, Any], *, tokenizer: PreTrainedTokenizerBase, encoding: RowEncoding) -> list[int]:
    """The image tokens a PaliGemma row writes before its conversation (`image_prefix` of its expanded
    media); none for every other row."""
    count, media = row.get("image_prefix") or 0, encoding.template.media
    if not count or media is None or media.image_token is None:
        return []
    return [tokenizer.convert_tokens_to_ids(media.image_token)] * count


def encode_supervised_row(
    row: dict[str, Any], *, tokenizer: PreTrainedTokenizerBase, encoding: RowEncoding
) -> dict[str, list[int]] | None:
    """`input_ids`, `attention_mask` and `labels` of one conversation, or None if nothing is trained
    (see `supervised_example`)."""
    check_supervised_options(encoding)
    _check_row(row)
    pairs = encode_turns(encoding.template, tokenizer, Conversation.from_row(row), mask_history=encoding.mask_history)
    return supervised_example(pairs, encoding=encoding, eos_id=tokenizer.eos_token_id,
                              prefix_ids=image_prefix_ids(row, tokenizer=tokenizer, encoding=encoding))


def check_supervised_options(encoding: RowEncoding) -> None:
    template = encoding.template
    if encoding.train_on_prompt and template.efficient_eos:
        raise ConfigError(f"train_on_prompt cannot be used with template '{template.name}' (efficient_eos)")


def check_supervised_row(row: dict[str, Any]) -> None:
    """Raise `DataError` unless `row` has a prompt ending with user and exactly one reply."""
    _check_row(row)


def supervised_example(
    pairs: list[tuple[list[int], list[int]]], *, encoding: RowEncoding, eos_id: int, prefix_ids: Sequence[int] = ()
) -> dict[str, list[int]] | None:
    """The supervised example of a conversation's (source_ids, target_ids) turns, or None if
    nothing is trained.

    Turns are truncated one by one against the remaining budget (`infer_seqlen`); turns after the
    budget runs out are dropped. With `mask_history` turns are taken last-first and only the last
    one is trained. `prefix_ids` (PaliGemma's image tokens) start the example untrained and count
    against the budget first; with `mask_history` the turns are written in front of them, as
    LLaMA-Factory writes them.
    """
    cutoff_len, mask_history, efficient_eos = encoding.cutoff_len, encoding.mask_history, encoding.template.efficient_eos
    if mask_history:
        pairs = pairs[::-1]  # the last turns have priority
    total_length = len(prefix_ids) + (1 if efficient_eos else 0)
    input_ids: list[int] = list(prefix_ids)
    labels: list[int] = [IGNORE_INDEX] * len(prefix_ids)
    for turn_idx, (source_ids, target_ids) in enumerate(pairs):
        if total_length >= cutoff_len:
            break
        source_len, target_len = infer_seqlen(len(source_ids), len(target_ids), cutoff_len - total_length)
        source_ids, target_ids = source_ids[:source_len], target_ids[:target_len]
        total_length += source_len + target_len
        source_labels = _source_labels(source_ids, turn_idx=turn_idx, encoding=encoding, eos_id=eos_id)
        target_labels = [IGNORE_INDEX] * target_len if mask_history and turn_idx != 0 else list(target_ids)
        if mask_history:
            input_ids = source_ids + target_ids + input_ids
            labels = source_labels + target_labels + labels
        else:
            input_ids += source_ids + target_ids
            labels += source_labels + target_labels
    if efficient_eos:
        input_ids.append(eos_id)
        labels.append(eos_id)
    if labels.count(IGNORE_INDEX) == len(labels):
        return None
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def _encode_reply(
    conversation: Conversation, reply: Message, *, tokenizer: PreTrainedTokenizerBase, encoding: RowEncoding
) -> tuple[list[int], list[int]]:
    """(prompt_ids, reply_ids) of the conversation's prompt answered by `reply`: everything before
    `reply` is prompt, earlier turns included.

    This is LLaMA-Factory's `encode_oneturn` (reasoning templates drop the thoughts of earlier
    replies); with `efficient_eos` the eos is appended to the reply.
    """
    template = encoding.template
    prompt_ids, reply_ids = encode_oneturn(template, tokenizer, replace(conversation, response=[reply]))
    reply_ids = list(reply_ids)
    if template.efficient_eos:
        reply_ids.append(tokenizer.eos_token_id)
    return prompt_ids, reply_ids


def _prompt_reply_example(prompt_ids: list[int], reply_ids: list[int], *, prefix: str = "") -> dict[str, list[int]]:
    input_ids = prompt_ids + reply_ids
    return {
        f"{prefix}input_ids": input_ids,
        f"{prefix}attention_mask": [1] * len(input_ids),
        f"{prefix}labels": [IGNORE_INDEX] * len(prompt_ids) + reply_ids,
    }


def encode_pairwise_row(
    row: dict[str, Any], *, tokenizer: PreTrainedTokenizerBase, encoding: RowEncoding
) -> dict[str, list[int]] | None:
    """`chosen_*` and `rejected_*` input ids, attention masks and labels of one preference row.

    The row's response is [chosen, rejected]. One budget split (`infer_seqlen`) is made for the
    prompt against the longer reply, and both replies are cut to that same length, so chosen and
    rejected share the prompt exactly. None if the cut leaves a reply with no token.
    """
    _check_row(row, kind="pairwise")
    conversation = Conversation.from_row(row)
    chosen, rejected = conversation.response
    prompt_ids, chosen_ids = _encode_reply(conversation, chosen, tokenizer=tokenizer, encoding=encoding)
    _, rejected_ids = _encode_reply(conversation, rejected, tokenizer=tokenizer, encoding=encoding)
    prompt_ids = image_prefix_ids(row, tokenizer=tokenizer, encoding=encoding) + prompt_ids
    source_len, target_len = infer_seqlen(len(prompt_ids), max(len(chosen_ids), len(rejected_ids)), encoding.cutoff_len)
    prompt_ids, chosen_ids, rejected_ids = prompt_ids[:source_len], chosen_ids[:target_len], rejected_ids[:target_len]
    if not chosen_ids or not rejected_ids:
        return None
    return {
        **_prompt_reply_example(prompt_ids, chosen_ids, prefix="chosen_"),
        **_prompt_reply_example(prompt_ids, rejected_ids, prefix="rejected_"),
    }


def encode_unsupervised_row(
    row: dict[str, Any], *, tokenizer: PreTrainedTokenizerBase, encoding: RowEncoding
) -> dict[str, list[int]]:
    """Prompt `input_ids` (ending with the generation prefix) and the reply as `labels`, for prediction.

    A row with exactly one response message uses it as the reference reply; any other row (no
    response, or a preference pair) gets an empty reply, whose labels are the template's turn end.
    Prompt and reply are cut together by `infer_seqlen`; the labels are not aligned to the inputs.
    """
    _check_prompt(row, kind="prediction")
    conversation = Conversation.from_row(row)
    response = conversation.response
    reply = response[0] if len(response) == 1 else {"role": "assistant", "content": ""}
    prompt_ids, reply_ids = _encode_reply(conversation, reply, tokenizer=tokenizer, encoding=encoding)
    prompt_ids = image_prefix_ids(row, tokenizer=tokenizer, encoding=encoding) + prompt_ids
    source_len, target_len = infer_seqlen(len(prompt_ids), len(reply_ids), encoding.cutoff_len)
    return {"input_ids": prompt_ids[:source_len], "attention_mask": [1] * source_len, "labels": reply_ids[:target_len]}


def _encode_feedback_row(
    row: dict[str, Any], kl_reply: Message, *, tokenizer: PreTrainedTokenizerBase, encoding: RowEncoding
) -> dict[str, Any] | None:
    conversation = Conversation.from_row(row)
    reply = conversation.response[0]
    example: dict[str, Any] = {}
    images = image_prefix_ids(row, tokenizer=tokenizer, encoding=encoding)
    for prefix, message in (("", reply), ("kl_", kl_reply)):
        prompt_ids, reply_ids = _encode_reply(conversation, message, tokenizer=tokenizer, encoding=encoding)
        prompt_ids = images + prompt_ids
        source_len, target_len = infer_seqlen(len(prompt_ids), len(reply_ids), encoding.cutoff_len)
        if prefix == "" and target_len == 0:
            return None
        example.update(_prompt_reply_example(prompt_ids[:source_len], reply_ids[:target_len], prefix=prefix))
    # LLaMA-Factory reads desirability off the reply slot that holds text, so an empty reply is undesired
    example["kto_tags"] = row["kto_tag"] and bool(reply["content"])
    return example


def encode_feedback_rows(
    rows: Sequence[dict[str, Any]],
    *,
    tokenizer: PreTrainedTokenizerBase,
    encoding: RowEncoding,
    batch_size: int = PREPROCESSING_BATCH_SIZE,
) -> list[dict[str, Any] | None]:
    """KTO examples, one per row in row order (None where the cut leaves the row's reply empty).

    A row is a prompt, one reply and a boolean `kto_tag` (desired or not). Besides its own example
    (`input_ids`, `attention_mask`, `labels`, `kto_tags`), each row gets a mismatched one for KTO's
    KL term (`kl_input_ids`, `kl_attention_mask`, `kl_labels`): its prompt with the reply of the
    row before it in its batch of `batch_size` rows, the first row taking the batch's last reply.
    This is LLaMA-Factory's rotation of the replies by one within each preprocessing batch.
    """
    for row in rows:
        _check_row(row, kind="feedback")
    encoded: list[dict[str, Any] | None] = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        for i, row in enumerate(batch):
            kl_reply = batch[i - 1]["response"][0]  # i == 0 takes the batch's last row
            encoded.append(_encode_feedback_row(row, kl_reply, tokenizer=tokenizer, encoding=encoding))
    return encoded


def _adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether pretraining writes the BOS token: LLaMA-Factory reads the tokenizer's
    `add_bos_token` flag, not what encoding does. Under transformers 5 the flag is False for
    tokenizer.json tokenizers (Llama 2/3, Mistral) even though their encoding adds BOS, so their
    blocks start with text; the flag is missing on some tokenizer classes."""
    return bool(getattr(tokenizer, "add_bos_token", False)) and tokenizer.bos_token_id is not None


def encode_pretrain_texts(
    texts: Sequence[str],
    *,
    tokenizer: PreTrainedTokenizerBase,
    template: Template,
    cutoff_len: int,
    packing: bool | None = None,
    batch_size: int = PREPROCESSING_BATCH_SIZE,
) -> list[dict[str, list[int]]]:
    """Pretraining examples from documents; labels equal the input ids.

    Each document gets the eos text appended (llama3: `<|end_of_text|>`). With packing, each batch
    of `batch_size` documents is concatenated and cut into blocks, the batch's tail dropped, and a
    tokenizer that adds BOS gets it written over position 0 of each block. Packing is on by default
    (`packing=None`) with blocks of `cutoff_len` tokens; an explicit `packing=True` gives blocks of
    `cutoff_len - 1`, because LLaMA-Factory cuts `cutoff_len` by one whenever packing is set
    (its stage-pt default is applied after that cut). With `packing=False` each document is one
    example cut to `cutoff_len`, the BOS text written in front when the tokenizer adds BOS.
    """
    block_size = cutoff_len - 1 if packing else cutoff_len
    if block_size < 1:
        minimum = 2 if packing else 1
        raise ConfigError(f"cutoff_len must be at least {minimum} (packing: {packing}), got {cutoff_len}")
    eos_text = template.pretrain_eos or tokenizer.eos_token
    if eos_text is None:
        raise ConfigError("the tokenizer has no eos token; call fix_tokenizer(template, tokenizer) first")
    adds_bos = _adds_bos(tokenizer)
    examples: list[list[int]] = []
    for start in range(0, len(texts), batch_size):
        batch = [text + eos_text for text in texts[start : start + batch_size]]
        if packing is False:
            batch = [tokenizer.bos_token + text for text in batch] if adds_bos else batch
            examples += tokenizer(batch, add_special_tokens=False, truncation=True, max_length=cutoff_len)["input_ids"]
            continue
        stream = list(chain.from_iterable(tokenizer(batch, add_special_tokens=False)["input_ids"]))
        total = len(stream) // block_size * block_size
        blocks = [stream[i : i + block_size] for i in range(0, total, block_size)]
        if adds_bos:
            for block in blocks:
                block[0] = tokenizer.bos_token_id
        examples += blocks
    return [{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)} for ids in examples]
