"""Token by token decoding of several answers at once, with the same tokens each would get alone.

A `Row` is one answer being written: its ids (prompt and answer, unpadded), the logits processors
`generate()` itself would build for its settings (repetition penalty, temperature, top-k/top-p, and
whatever the model's generation config adds), its own random generator when it samples, and its text
cut at its stop strings. `BatchDecoder` keeps the rows of a batch in one left-padded KV cache: rows
that arrive together are prefilled together, those of similar lengths in one forward (left-padded,
the padding masked), then join the batch, their caches padded on the left; each step feeds every
row's last token at that row's own position and masks the padding, its keys and values written in
place into the cache's spare columns (`growing_cache.py`). Each row's processors see only
that row's own ids, so a repetition penalty never sees a pad token; for greedy rows whose only
processor is a repetition penalty, the same arithmetic runs on the whole batch at once, over the
tokens each row holds. A row ends with a stop token, its token budget, a stop string or a cancel,
and the padding no row needs any more is trimmed. `SoloDecoder` runs `generate()` itself, one row
at a time, for the models a shared cache cannot serve (see `batchable`).
"""

from __future__ import annotations

import copy
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tuneline.core.serving.backends import Answer, Cancelled, Ticket, discard_text
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
        self.length, self.last = len(prompt), prompt[-1]
        self.tokens = list(prompt)
        """Prompt and answer so far; `ids` holds them as a tensor only where the row's own processors read it."""
        self.kwargs, self.eos = kwargs, frozenset(kwargs["eos_token_id"])
        self.processors, self.sampling = _processors(model, kwargs, self.ids[:, :len(prompt)])
        self.penalty = None if self.sampling else _only_penalty(self.processors)
        """The repetition penalty, when it is all this row's greedy decoding applies (1.0: none): the batch
        then applies it to every such row at once. None: the row's own processors run on its own ids."""
        self.generator = None
        if self.sampling:  # a generator of its own: a row's draws do not depend on which rows share its batch
            self.generator = torch.Generator(device=model.device)
            self.generator.manual_seed(int(torch.randint(2**62, ())))
        self.pieces = IncrementalDecoder(decode)
        self.text = StopText(ticket.prepared.stops, ticket.write)
        self.reads_pieces = bool(ticket.prepared.stops) or ticket.write is not discard_text
        """Whether its text is needed as it grows (streamed, or watched for stop strings); else it is decoded once, at the end."""
        self.ended_by_stop = False
        self.left = False
        """Whether the row has ended, its ticket told (its slot in a batch is then dead until the next rebuild)."""
        self.started = time.monotonic()

    @property
    def new_ids(self) -> list[int]:
        return self.tokens[self.prompt_length:]

    def choose(self, logits: torch.Tensor) -> int:
        """The next token from this row's (1, vocab) float32 logits."""
        import torch

        ids, scores = self.ids[:, :self.length], logits
        for processor in self.processors:  # as LogitsProcessorList calls them, without its signature check per call
            scores = processor(ids, scores)
        if self.sampling:
            return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=self.generator))
        return int(torch.argmax(scores, dim=-1))

    def push(self, token: int) -> bool:
        """Append `token`; True when the answer has ended (a stop token, its budget, a stop string)."""
        if self.penalty is None:  # its own processors read its ids; a batch-penalized row's tensor stays the prompt
            self.ids[0, self.length] = token
        self.tokens.append(token)
        self.length, self.last = self.length + 1, token
        if token in self.eos:
            self.ended_by_stop = True
        elif self.reads_pieces and self.text.feed(self.pieces.push(token)):
            self.ended_by_stop = True
        return self.ended_by_stop or self.length - self.prompt_length >= self.budget

    def finish(self) -> None:
        """Hand the answer (cut at its stop string) to the ticket."""
        new = self.new_ids
        text = self.text.finish(self.decode(new))
        stopped = self.ended_by_stop or self.text.stopped
        self.left = True
        self.ticket.done(Answer(text, self.prompt_length, len(new), "stop" if stopped else "length"))

    def fail(self, error: BaseException) -> None:
        self.left = True
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
    """Up to `capacity` rows decoded together, one token each per step.

    Copying the cache is what joining and leaving cost, so both happen together: a row that ends keeps
    its slot (fed, its output unread) until rows join, or until half the slots are dead; and waiting
    rows join `admit_at_least` at a time (fewer only when that is all that waits, or nothing runs).
    """

    PREFILL_TOKENS, GROUPED_LENGTH = 8192, 192
    """Prompt tokens, padding included, read by one prefill forward at most; and the longest prompt prefilled
    with others (a longer one reads faster alone, where attention needs no padding mask)."""

    def __init__(self, model: PreTrainedModel, *, capacity: int) -> None:
        self.model, self.capacity = model, capacity
        self.admit_at_least = max(1, capacity // 4)
        self.slots: list[Row] = []
        """The rows of the cache, in its order, those that have left included."""
        self.cache = None
        self.mask: torch.Tensor | None = None
        """(slots, cached length): 1 where a row has a token, 0 where it is padded on the left."""
        self.seen: torch.Tensor | None = None
        """(slots, vocabulary + 1): the tokens each row holds, for the repetition penalty of the whole batch."""
        self.penalties: torch.Tensor | None = None
        self.vocabulary = 0
        forward = inspect.signature(model.forward).parameters
        self.cache_key = "cache" if "cache" in forward else "past_key_values"  # renamed in transformers 5.25
        self.extra = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}

    @property
    def rows(self) -> list[Row]:
        """The rows still generating."""
        return [row for row in self.slots if not row.left]

    def admit(self, rows: Sequence[Row]) -> None:
        """Prefill the rows (those of similar lengths together, left-padded), choose each one's first token,
        and rebuild the batch with those that go on in place of the rows that left."""
        import torch

        parts = []
        for group in _similar_lengths(rows, most=self.PREFILL_TOKENS, longest=self.GROUPED_LENGTH):
            width = max(row.length for row in group)
            mask = torch.tensor([[0] * (width - row.length) + [1] * row.length for row in group], device=self.model.device)
            try:
                with torch.no_grad():
                    ids = torch.stack([torch.nn.functional.pad(row.ids[0, :row.length], (width - row.length, 0))
                                       for row in group])
                    cache, logits = self._forward(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
                    ended = [row.push(row.choose(logits[i:i + 1])) for i, row in enumerate(group)]
            except Exception as e:  # these requests alone fail; the batch goes on
                log.exception("Generation failed while reading %d prompts of up to %d tokens", len(group), width)
                for row in group:
                    row.fail(e)
                continue
            self.vocabulary = logits.shape[-1]
            for row in (row for row, done in zip(group, ended) if done):
                row.finish()
            going = [i for i, done in enumerate(ended) if not done]
            if going:
                parts.append(([group[i] for i in going], cache, mask, None if len(going) == len(group) else going))
        if parts:
            try:
                self._rebuild(parts)
            except Exception as e:  # the joining rows are in no slot yet: told here, or never
                for rows, *_ in parts:
                    for row in rows:
                        row.fail(e)
                raise

    def step(self) -> None:
        """One token for every row; rows that end or were cancelled leave."""
        import torch

        for row in self.slots:
            if not row.left and row.ticket.cancelled.is_set():
                row.fail(Cancelled())
        live = len(self.rows)
        if live == 0 or 2 * live <= len(self.slots):
            self._rebuild([])
        if not self.slots:
            return
        tokens = torch.tensor([[row.last] for row in self.slots], device=self.model.device)
        positions = torch.tensor([[row.length - 1] for row in self.slots], device=self.model.device)
        self.mask = torch.cat([self.mask, torch.ones_like(tokens)], dim=1)
        try:
            with torch.no_grad():
                _, logits = self._forward(tokens, self.mask, positions, cache=self.cache)
                chosen = self._choose(logits)
        except Exception as e:  # the batch's state is unknown now: its rows fail, the server goes on
            log.exception("Generation failed for a batch of %d requests", live)
            self.drop(self.rows, reason=e)
            return
        for row, token in zip(self.slots, chosen):
            if not row.left and row.push(token):
                row.finish()

    def drop(self, leaving: Sequence[Row], *, reason: BaseException | None) -> None:
        """Remove `leaving` from the batch, telling each `reason` if given."""
        for row in leaving:
            if reason is not None and not row.left:
                row.fail(reason)
            row.left = True
        self._rebuild([])

    def _choose(self, logits: torch.Tensor) -> list[int]:
        """Each slot's next token: the rows whose greedy decoding only applies a repetition penalty at once (the
        penalty's arithmetic, on the tokens each row holds), the others through their own processors."""
        import torch

        shared = [row.penalty is not None for row in self.slots]
        best: list[int] = []
        if any(shared):
            held = self.seen[:, :logits.shape[-1]]
            penalized = torch.where(logits < 0, logits * self.penalties, logits / self.penalties)
            best = torch.where(held, penalized, logits).argmax(dim=-1).tolist()
        chosen = [best[i] if shared[i] else row.last if row.left else row.choose(logits[i:i + 1])
                  for i, row in enumerate(self.slots)]
        index = torch.tensor(chosen, device=logits.device).clamp(max=self.vocabulary)
        self.seen[torch.arange(len(chosen), device=logits.device), index] = True
        return chosen

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, *, cache: object = None):
        """The cache after reading `ids` and the float32 logits of each row's last token (as generate() casts them)."""
        import torch
        from transformers import DynamicCache

        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        output = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                            **{self.cache_key: cache}, **self.extra)
        return cache, output.logits[:, -1].to(dtype=torch.float32)

    def _rebuild(self, joining: Sequence[tuple[Sequence[Row], object, torch.Tensor, Sequence[int] | None]]) -> None:
        """The batch of the rows still generating and the `joining` (rows, cache, mask, the cache's rows they
        are, or None for all) parts: every cache left-padded to the longest, the padding masked, without the
        columns that are padding in every row. Each part is copied once, into its place in the new cache."""
        import torch
        from transformers import DynamicCache

        from tuneline.core.serving.growing_cache import GrowingLayer

        keep = [i for i, row in enumerate(self.slots) if not row.left]
        parts = [(self.rows, self.cache, self.mask, None if len(keep) == len(self.slots) else keep)] if keep else []
        parts += list(joining)
        if not parts:
            self.slots, self.cache, self.mask, self.seen, self.penalties = [], None, None, None, None
            return
        seen = [self.seen if len(keep) == len(self.slots) else self.seen[keep]] if keep else []
        penalties = [self.penalties if len(keep) == len(self.slots) else self.penalties[keep]] if keep else []
        device = self.model.device
        for rows, *_ in joining:
            held = torch.zeros((len(rows), self.vocabulary + 1), dtype=torch.bool, device=device)
            for i, row in enumerate(rows):
                held[i, torch.tensor(row.tokens, device=device).clamp(max=self.vocabulary)] = True
            seen.append(held)
            penalties.append(torch.tensor([[row.penalty or 1.0] for row in rows], dtype=torch.float32, device=device))
        index = [None if chosen is None else torch.tensor(chosen, device=device) for _, _, _, chosen in parts]
        masks = [mask if chosen is None else mask[chosen] for (_, _, mask, _), chosen in zip(parts, index)]
        starts = [int(mask.any(dim=0).nonzero()[0]) for mask in masks]  # the first column some row needs
        width = max(mask.shape[1] - start for mask, start in zip(masks, starts))
        total = sum(len(rows) for rows, *_ in parts)

        def joined(tensors: Sequence[torch.Tensor]) -> torch.Tensor:  # (rows, heads, length, dim) each
            first = tensors[0]
            out = first.new_zeros((total, first.shape[1], width + GrowingLayer.SPARE_COLUMNS, first.shape[3]))
            at = 0
            for tensor, chosen, start in zip(tensors, index, starts):
                rows = tensor.shape[0] if chosen is None else len(chosen)
                length = tensor.shape[2] - start
                target = out[at:at + rows, :, width - length:width]
                target.copy_(tensor[:, :, start:] if chosen is None else tensor[chosen, :, start:])
                at += rows
            return out

        layers = [[(keys, values) for keys, values, *_ in cache] for _, cache, _, _ in parts]
        self.cache = DynamicCache(config=self.model.config)
        self.cache.layers = [GrowingLayer(joined([part[i][0] for part in layers]), joined([part[i][1] for part in layers]),
                                          length=width)
                             for i in range(len(layers[0]))]
        self.mask = torch.cat([torch.nn.functional.pad(mask[:, start:], (width - mask.shape[1] + start, 0))
                               for mask, start in zip(masks, starts)])
        self.seen, self.penalties = torch.cat(seen), torch.cat(penalties)
        self.slots = [row for rows, *_ in parts for row in rows]


def _similar_lengths(rows: Sequence[Row], *, most: int, longest: int) -> list[list[Row]]:
    """`rows` in groups to prefill together: none more than twice (and 16 tokens) longer than the shortest of
    its group, at most `most` tokens once padded; a row longer than `longest` alone."""
    groups: list[list[Row]] = []
    for row in sorted(rows, key=lambda row: row.length):
        group = groups[-1] if groups else None
        if (group and row.length <= min(2 * group[0].length + 16, longest)
                and row.length * (len(group) + 1) <= most):
            group.append(row)
        else:
            groups.append([row])
    return groups


def _only_penalty(processors: LogitsProcessorList) -> float | None:
    """The penalty when `processors` apply nothing but a repetition penalty over all the ids (1.0 for none)."""
    from transformers import RepetitionPenaltyLogitsProcessor

    if not processors:
        return 1.0
    only = processors[0]
    if len(processors) == 1 and type(only) is RepetitionPenaltyLogitsProcessor and only.prompt_ignore_length is None:
        return float(only.penalty)
    return None


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

    capacity = admit_at_least = 1

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
