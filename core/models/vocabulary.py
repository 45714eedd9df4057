"""Tokens added to a model's vocabulary: which they are, how the embeddings grow for them, how their
rows start (`init_special_tokens`).

The tokenize stage adds the tokens (the added-token keys, then the template's own) and records them
beside the tokenized data (`NewTokens`, in `new_tokens.json`); training grows the embeddings to the
tokenizer, in steps of 64 rows as LLaMA-Factory does, and starts each new row as asked:

- `noise_init`: the mean of the existing rows plus Gaussian noise of standard deviation 1/√width;
- `desc_init`: the mean embedding of the token's description (its pieces that are existing tokens;
  the mean of all existing rows when none is), the other new rows as noise_init;
- `desc_init_w_noise`: the same plus the noise.

The new rows are the rows the growth adds and the rows of the added tokens; a LoRA adapter trains
and saves exactly those (see `core/models/adapters.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tuneline.core.config import ModelConfig

NEW_TOKENS_FILE = "new_tokens.json"
PAD_TO_MULTIPLE_OF = 64  # LLaMA-Factory grows the embeddings in steps of 64 rows
Init = Literal["noise_init", "desc_init", "desc_init_w_noise"]


@dataclass(frozen=True)
class NewTokens:
    """The tokens the tokenize stage added to the tokenizer it loaded: ids `first_id` onwards, in order."""

    first_id: int
    tokens: tuple[str, ...] = ()
    description_ids: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """A described token -> the ids its description encodes to with the stage's tokenizer."""

    @property
    def ids(self) -> range:
        return range(self.first_id, self.first_id + len(self.tokens))

    def write(self, folder: str | Path) -> None:
        record = {"first_id": self.first_id, "tokens": list(self.tokens),
                  "description_ids": {token: list(ids) for token, ids in self.description_ids.items()}}
        (Path(folder) / NEW_TOKENS_FILE).write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, folder: str | Path) -> NewTokens | None:
        """The record of tokenized data in `folder`; None where nothing was added."""
        path = Path(folder) / NEW_TOKENS_FILE
        if not path.is_file():
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
        return cls(first_id=record["first_id"], tokens=tuple(record["tokens"]),
                   description_ids=MappingProxyType({t: tuple(ids) for t, ids in record["description_ids"].items()}))


def describe_new_tokens(tokenizer: PreTrainedTokenizerBase, *, first_id: int, descriptions: Mapping[str, str]) -> NewTokens:
    """What `tokenizer` holds beyond its first `first_id` tokens, each described token with the
    ids of its description (encoded as LLaMA-Factory encodes it, without special tokens)."""
    tokens = tuple(tokenizer.convert_ids_to_tokens(list(range(first_id, len(tokenizer)))))
    encoded = {token: tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) for token, text in descriptions.items()}
    return NewTokens(first_id=first_id, tokens=tokens, description_ids=MappingProxyType(encoded))


def grow_vocabulary(model: PreTrainedModel, *, vocab_size: int, new_tokens: NewTokens | None = None,
                    init: Init = "noise_init") -> tuple[int, ...]:
    """Grow `model`'s embeddings to hold `vocab_size` tokens (to the next multiple of 64) and start
    the new rows as `init` says; the rows that are new (grown, or of `new_tokens`), in order."""
    # Mllama's input embeddings have rows beyond its output head (its image token's among them): the head's
    # rows count, and each matrix starts only the rows that are new to it
    before = [weight.shape[0] for weight in _embedding_weights(model)]
    old_size = min(before)
    if vocab_size > old_size:
        # a quantized model's embeddings and head stay in full precision, so they grow like any other
        model.resize_token_embeddings(vocab_size, pad_to_multiple_of=PAD_TO_MULTIPLE_OF, mean_resizing=False)
    ids = new_tokens.ids if new_tokens else ()
    for weight, rows_before in zip(_embedding_weights(model), before):
        rows = (*[i for i in ids if i < rows_before], *range(rows_before, weight.shape[0]))
        if rows:
            _start_rows(weight, rows=rows, old_rows=min(rows), new_tokens=new_tokens, init=init)
    new_size = min(weight.shape[0] for weight in _embedding_weights(model))
    return (*[i for i in ids if i < old_size], *range(old_size, new_size))


def _embedding_weights(model: PreTrainedModel) -> list[torch.Tensor]:
    """The input embeddings' weight, and the output head's where it is a separate matrix."""
    weights = [model.get_input_embeddings().weight]
    output = model.get_output_embeddings()
    if output is not None and output.weight is not weights[0]:
        weights.append(output.weight)
    return weights


def _start_rows(weight: torch.Tensor, *, rows: tuple[int, ...], old_rows: int, new_tokens: NewTokens | None,
                init: Init) -> None:
    """Write the starting values of `rows` of `weight` (one row per token); `old_rows` rows precede
    every new one, and only they are averaged."""
    import torch

    width = weight.shape[1]
    with torch.no_grad():
        data = weight.data
        mean = data[:old_rows].mean(dim=0)
        noise = torch.empty((len(rows), width), dtype=data.dtype, device=data.device).normal_(0.0, 1.0 / math.sqrt(width))
        starts = mean.expand(len(rows), width).clone() + noise
        described = _described_rows(new_tokens, init=init)
        for position, row in enumerate(rows):
            if row in described:
                ids = [i for i in described[row] if i < old_rows]
                base = data[ids].mean(dim=0) if ids else mean
                starts[position] = base + (noise[position] if init == "desc_init_w_noise" else 0.0)
        data[torch.tensor(rows, device=data.device)] = starts


def _described_rows(new_tokens: NewTokens | None, *, init: Init) -> dict[int, tuple[int, ...]]:
    """Row -> description ids, for the described new tokens when `init` starts them from descriptions."""
    if new_tokens is None or init == "noise_init":
        return {}
    position = {token: new_tokens.first_id + i for i, token in enumerate(new_tokens.tokens)}
    return {position[token]: ids for token, ids in new_tokens.description_ids.items() if token in position}


def rows_that_train(rows: tuple[int, ...], model_config: ModelConfig) -> tuple[int, ...]:
    """The new rows an adapter trains: all of them when the added-token keys or `resize_vocab` put
    tokens in the vocabulary that the data writes; none otherwise. Without those keys the only new
    tokens are a template's stop words beyond the vocabulary (Llama 3's `<|eom_id|>` on a Llama-3
    tokenizer), which the data never holds: the template check refuses a template that writes one.
    LLaMA-Factory does not grow the embeddings for them at all."""
    adds = model_config.add_tokens or model_config.add_special_tokens or model_config.new_special_tokens_config
    return rows if adds or model_config.resize_vocab else ()
