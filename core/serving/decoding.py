"""Token by token decoding of several answers at once, with the same tokens each would get alone.

A `Row` is one answer being written: its ids (prompt and answer, unpadded), the logits processors
`generate()` itself would build for its settings (repetition penalty, temperature, top-k/top-p, and
whatever the model's generation config adds), its own random generator when it samples, and its text
cut at its stop strings. `BatchDecoder` keeps the rows of a batch in one left-padded KV cache: a row
is prefilled alone (no padding in its prompt), then joins the batch, its cache padded on the left;
each step feeds every row's last token at that row's own position, masks the padding, and applies
each row's processors to that row's own ids, so a repetition penalty never sees a pad token. A row
leaves as soon as it ends (a stop token, its token budget, a stop string, or a cancel), and padding
no row needs any more is trimmed. `SoloDecoder` runs `generate()` itself, one row at a time, for
the models a shared cache cannot serve (see `batchable`).
"""

from __future__ import annotations

import copy
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tuneline.core.serving.backends import Answer, Cancelled, Ticket
from tuneline.core.serving.stop_text import IncrementalDecoder, StopText

if TYPE_CHECKING:
    import torch
    from transformers import LogitsProcessorList, PreTrainedModel

log = logging.getLogger(__name__)


class Row:
    """One answer being generated for `ticket`."""

    def __init__(self, ticket: Ticket, *, model: PreTrainedModel, kwargs: dict, decode: Callable[[Sequence[int]], str]) -> None:
        import torch

        self.ticket, self.decode = ticket, decode
        prompt = ticket.prepared.prompt
        self.prompt_length, self.budget = len(prompt), ticket.prepared.generating.max_new_tokens
        self.ids = torch.zeros((1, len(prompt) + self.budget), dtype=torch.long, device=model.device)
        self.ids[0, :len(prompt)] = torch.tensor(prompt)
        self.length = len(prompt)
        self.kwargs, self.eos = kwargs, frozenset(kwargs["eos_token_id"])
        self.processors, self.sampling = _processors(model, kwargs, self.ids[:, :len(prompt)])
        self.generator = None
        if self.sampling:  # a generator of its own: a row's draws do not depend on which rows share its batch
            self.generator = torch.Generator(device=model.device)
            self.generator.manual_seed(int(torch.randint(2**62, ())))
        self.pieces = IncrementalDecoder(decode)
        self.text = StopText(ticket.prepared.stops, ticket.write)
        self.ended_by_stop = False
        self.started = time.monotonic()

    @property
    def new_ids(self) -> list[int]:
        return self.ids[0, self.prompt_length:self.length].tolist()

    @property
    def last(self) -> int:
        return int(self.ids[0, self.length - 1])

    def choose(self, logits: torch.Tensor) -> int:
        """The next token from this row's (1, vocab) float32 logits."""
        import torch

        scores = self.processors(self.ids[:, :self.length], logits)
        if self.sampling:
            return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=self.generator))
        return int(torch.argmax(scores, dim=-1))

    def push(self, token: int) -> bool:
        """Append `token`; True when the answer has ended (a stop token, its budget, a stop string)."""
        self.ids[0, self.length] = token
        self.length += 1
        if token in self.eos:
            self.ended_by_stop = True
        elif self.text.feed(self.pieces.push(token)):
            self.ended_by_stop = True
        return self.ended_by_stop or self.length - self.prompt_length >= self.budget

    def finish(self) -> None:
        """Hand the answer (cut at its stop string) to the ticket."""
        new = self.new_ids
        text = self.text.finish(self.decode(new))
        stopped = self.ended_by_stop or self.text.stopped
        self.ticket.done(Answer(text, self.prompt_length, len(new), "stop" if stopped else "length"))

    def fail(self, error: BaseException) -> None:
        self.ticket.done(error)


def batchable(model: PreTrainedModel, *, num_beams: int) -> bool:
    """Whether rows of `model` can share one left-padded cache: a text decoder whose every layer keeps a
    plain growing cache, decoding without beams. Sliding-window, hybrid and recurrent caches, composite
    (vision-language) models and models that route tokens past layers decode alone through generate()."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from tuneline.core.models.mixture_of_depths import routes_tokens

    if num_beams != 1 or routes_tokens(model) or model.config.get_text_config() is not model.config:
        return False
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


class BatchDecoder:
    """Up to `capacity` rows decoded together, one token each per step."""

    def __init__(self, model: PreTrainedModel, *, capacity: int) -> None:
        self.model, self.capacity = model, capacity
        self.rows: list[Row] = []
        self.cache = None
        self.mask: torch.Tensor | None = None
        forward = inspect.signature(model.forward).parameters
        self.cache_key = "cache" if "cache" in forward else "past_key_values"  # renamed in transformers 5.25
        self.extra = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}

    def admit(self, rows: Sequence[Row]) -> None:
        """Prefill each row alone, choose its first token, and add those that go on to the batch."""
        import torch

        joining = []
        for row in rows:
            try:
                with torch.no_grad():
                    ids = row.ids[:, :row.length]
                    cache, logits = self._forward(ids, torch.ones_like(ids), torch.arange(row.length, device=ids.device)[None])
                    ended = row.push(row.choose(logits[0:1]))
            except Exception as e:  # this request alone fails; the batch goes on
                log.exception("Generation failed while reading a prompt of %d tokens", row.length)
                row.fail(e)
                continue
            if ended:
                row.finish()
            else:
                joining.append((row, cache))
        if joining:
            self._join(joining)

    def step(self) -> None:
        """One token for every row; rows that end or were cancelled leave."""
        import torch

        self.drop([row for row in self.rows if row.ticket.cancelled.is_set()], reason=Cancelled())
        if not self.rows:
            return
        tokens = torch.tensor([[row.last] for row in self.rows], device=self.model.device)
        positions = torch.tensor([[row.length - 1] for row in self.rows], device=self.model.device)
        self.mask = torch.cat([self.mask, torch.ones_like(tokens)], dim=1)
        try:
            with torch.no_grad():
                _, logits = self._forward(tokens, self.mask, positions, cache=self.cache)
                ended = [row for i, row in enumerate(self.rows) if row.push(row.choose(logits[i:i + 1]))]
        except Exception as e:  # the batch's state is unknown now: its rows fail, the server goes on
            log.exception("Generation failed for a batch of %d requests", len(self.rows))
            self.drop(list(self.rows), reason=e)
            return
        for row in ended:
            row.finish()
        self.drop(ended, reason=None)

    def drop(self, leaving: Sequence[Row], *, reason: BaseException | None) -> None:
        """Remove `leaving` from the batch (telling each `reason`, if given) and trim padding no row needs."""
        if not leaving:
            return
        for row in leaving:
            if reason is not None:
                row.fail(reason)
        gone = {id(row) for row in leaving}
        keep = [i for i, row in enumerate(self.rows) if id(row) not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.cache = self.mask = None
            return
        import torch
        from transformers import DynamicCache

        index = torch.tensor(keep, device=self.mask.device)
        mask = self.mask[index]
        start = int(mask.any(dim=0).nonzero()[0])  # columns before it are padding in every row left
        self.mask = mask[:, start:]
        self.cache = DynamicCache([(keys[index, :, start:], values[index, :, start:]) for keys, values, *_ in self.cache])

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, *, cache: object = None):
        """The cache after reading `ids` and the float32 logits of each row's last token (as generate() casts them)."""
        import torch
        from transformers import DynamicCache

        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        output = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                            **{self.cache_key: cache}, **self.extra)
        return cache, output.logits[:, -1].to(dtype=torch.float32)

    def _join(self, joining: Sequence[tuple[Row, object]]) -> None:
        """Add prefilled rows: every cache left-padded to the longest, the padding masked."""
        import torch
        import torch.nn.functional as F
        from transformers import DynamicCache

        parts = [(self.rows, self.cache, self.mask)] if self.rows else []
        for row, cache in joining:
            parts.append(([row], cache, torch.ones((1, cache.get_seq_length()), dtype=torch.long, device=self.model.device)))
        width = max(mask.shape[1] for _, _, mask in parts)

        def padded(tensors: Sequence[torch.Tensor]) -> torch.Tensor:  # (rows, heads, length, dim) each, to `width`
            return torch.cat([F.pad(t, (0, 0, width - t.shape[2], 0)) for t in tensors])

        layers = [[(keys, values) for keys, values, *_ in cache] for _, cache, _ in parts]
        self.cache = DynamicCache([(padded([part[i][0] for part in layers]), padded([part[i][1] for part in layers]))
                                   for i in range(len(layers[0]))])
        self.mask = torch.cat([F.pad(mask, (width - mask.shape[1], 0)) for _, _, mask in parts])
        self.rows = [row for rows, _, _ in parts for row in rows]


def _processors(model: PreTrainedModel, kwargs: dict, prompt: torch.Tensor) -> tuple[LogitsProcessorList, bool]:
    """The logits processors generate() builds for `kwargs` over the model's generation config (its private
    helpers, as transformers' own continuous batching calls them), and whether they sample."""
    from transformers import LogitsProcessorList

    config = copy.deepcopy(model.generation_config)
    config.update(**kwargs)
    model._prepare_special_tokens(config, True, device=model.device)
    processors = model._get_logits_processor(generation_config=config, input_ids_seq_length=prompt.shape[1],
                                             encoder_input_ids=prompt, logits_processor=LogitsProcessorList(),
                                             device=model.device, model_kwargs={})
    return processors, bool(config.do_sample)


class SoloDecoder:
    """One row at a time through the model's own generate(), for a model `batchable` refuses."""

    capacity = 1

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.rows: list[Row] = []

    def admit(self, rows: Sequence[Row]) -> None:
        self.rows.extend(rows)

    def step(self) -> None:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        row = self.rows.pop(0)
        kwargs = row.kwargs
        streams = kwargs["num_beams"] == 1  # beams reorder: their text is read once they are done

        class Watch(StoppingCriteria):
            def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **_: object) -> torch.BoolTensor:
                done = row.ticket.cancelled.is_set() or (streams and row.push(int(input_ids[0, -1])))
                return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

        ids = row.ids[:, :row.prompt_length]
        try:
            with torch.no_grad():
                output = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                             stopping_criteria=StoppingCriteriaList([Watch()]), **kwargs)
        except Exception as e:
            log.exception("Generation failed for a prompt of %d tokens", row.prompt_length)
            row.fail(e)
            return
        if row.ticket.cancelled.is_set():
            row.fail(Cancelled())
            return
        if not streams:
            for token in output[0, row.prompt_length:].tolist():
                if row.push(token):
                    break
        row.finish()

    def drop(self, leaving: Sequence[Row], *, reason: BaseException | None) -> None:
        for row in leaving:
            self.rows.remove(row)
            if reason is not None:
                row.fail(reason)
