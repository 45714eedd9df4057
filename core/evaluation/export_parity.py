"""The train/serve parity gate of an export: the exported folder must prompt and answer as training did.

Two checks, run on the export's draft before it is moved into place (a failing export leaves nothing):

- **Rendering**: for probe conversations (the first rows of the stage's dataset, else a built-in
  two-turn chat), the exported tokenizer's `apply_chat_template` must write the ids that training's
  template encoder writes: the prompt with the generation prefix (what a server sends the model)
  and the whole conversation (what the model was trained on). A chat template lost or changed on
  the way out is caught here, not by users of the served model.
- **Answers**: when the export merged a LoRA adapter, the merged model's greedy answers to the probe
  prompts must equal the base model's with the adapter on top, token for token.

Rows with tool descriptions or media are not probed: the exported Jinja template renders neither
(docs/ARCHITECTURE.md, "The train/serve parity gate").
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.config import StageConfig
from tuneline.core.data.media.columns import MEDIA_COLUMNS
from tuneline.core.errors import TunelineError
from tuneline.core.templates.check import PROBE, PROBE_SYSTEM, around, first_difference
from tuneline.core.templates.conversation import Conversation, encode_prompt, encode_turns, render_text

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tuneline.core.templates.spec import Template

PROBE_COUNT = 4
"""How many conversations probe an export unless the export section says otherwise."""
ANSWER_TOKENS = 16
"""Greedy tokens compared per probe prompt between the merged model and base + adapter."""


class ParityError(TunelineError):
    """The exported folder does not render or answer as the trained model did."""


@dataclass(frozen=True)
class Probe:
    """A conversation to render both ways, and where it came from (for the message)."""

    origin: str
    conversation: Conversation


def probe_conversations(config: StageConfig | None, *, count: int = PROBE_COUNT) -> list[Probe]:
    """The first `count` plain conversations of the stage's training data (one reply each, no tools,
    no media), else the built-in probe with and without a system prompt."""
    probes = _dataset_probes(config, count=count) if config is not None and config.data.dataset else []
    if probes:
        return probes
    turns = tuple(PROBE)
    return [Probe("the built-in probe with a system prompt", Conversation(turns[:3], turns[3:], system=PROBE_SYSTEM)),
            Probe("the built-in probe", Conversation(turns[:3], turns[3:]))][:max(count, 1)]


def _dataset_probes(config: StageConfig, *, count: int) -> list[Probe]:
    from tuneline.core.data.tokenization import dataset_names, iter_rows

    names = dataset_names(config.data.dataset)
    probes = []
    # the same rows read again as their origins (dataset, file, row from 1), to name a probe as data errors name rows
    rows_and_origins = zip(iter_rows(names, config), iter_rows(names, config, origins=True))
    for row, origin in itertools.islice(rows_and_origins, 64):
        if len(probes) == count:
            break
        if _plain(row):
            conversation = Conversation(prompt=row["prompt"], response=row["response"][:1], system=row.get("system") or None)
            probes.append(Probe(origin.describe(), conversation))
    return probes


def _plain(row: dict[str, Any]) -> bool:
    media = any(row.get(column) for column in MEDIA_COLUMNS)
    response = row.get("response") or []
    return bool(row.get("prompt")) and bool(response) and response[0].get("role") == "assistant" \
        and not row.get("tools") and not media


@dataclass(frozen=True)
class RenderingCheck:
    """What rendering the probes both ways found: a problem (the exported chat template writes other
    text than training's template: lost or changed) fails the export; a warning (the same text, which
    the tokenizer segments otherwise as one string than as training's separately encoded pieces, as a
    SentencePiece tokenizer does around a message's first word) is recorded with it."""

    problem: str | None = None
    warning: str | None = None


def check_rendering(exported: PreTrainedTokenizerBase, *, template: Template, trained: PreTrainedTokenizerBase,
                    probes: Sequence[Probe]) -> RenderingCheck:
    """Render every probe with the exported chat template and with training's template encoder (with
    `trained`, the tokenizer training used): its prompt with the generation prefix (what a server sends
    the model) and the whole conversation (what the model trained on); the first difference, described."""
    if not exported.chat_template:
        return RenderingCheck(problem="the exported tokenizer has no chat template, so a server cannot render prompts "
                                      "as training did.")
    warning = None
    for probe in probes:
        for what, messages, prompt_only in _renderings(probe.conversation):
            conversation = probe.conversation
            training_ids = encode_prompt(template, trained, Conversation(conversation.prompt, system=conversation.system)) \
                if prompt_only else [t for pair in encode_turns(template, trained, conversation) for ids in pair for t in ids]
            served_ids = _rendered(exported, messages, add_generation_prompt=prompt_only, tokenize=True)
            at = first_difference(training_ids, served_ids)
            if at is None:
                continue
            training_text = render_text(template, trained, messages=[*conversation.prompt, *([] if prompt_only else conversation.response)],
                                        system=conversation.system)
            described = (f"the {what} of {probe.origin}: they first differ at token {at} ({len(training_ids)} ids in training, "
                         f"{len(served_ids)} from the export). Training wrote {around(trained, training_ids, at)}; the export "
                         f"writes {around(exported, served_ids, at)}.")
            if training_text != _rendered(exported, messages, add_generation_prompt=prompt_only, tokenize=False):
                return RenderingCheck(problem=f"the exported chat template writes other text than training for {described}")
            warning = warning or (f"the exported chat template writes the text training wrote, which the tokenizer segments "
                                  f"otherwise as one string, for {described}")
    return RenderingCheck(warning=warning)


def _renderings(conversation: Conversation) -> list[tuple[str, list[dict[str, Any]], bool]]:
    """(what, messages, prompt only) of the two renderings compared."""
    system = [{"role": "system", "content": conversation.system}] if conversation.system else []
    prompt = [dict(message) for message in conversation.prompt]
    return [("prompt with the generation prefix", system + prompt, True),
            ("whole conversation", system + prompt + [dict(m) for m in conversation.response], False)]


def _rendered(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], *, add_generation_prompt: bool,
              tokenize: bool) -> Any:
    try:
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize,
                                                 return_dict=False)
        return list(rendered) if tokenize else rendered
    except Exception as e:  # the chat template's own errors (a broken Jinja)
        raise ParityError(f"the exported chat template cannot render a probe conversation: {type(e).__name__}: {e}") from e


def answers_problem(merged: PreTrainedModel, unmerged: PreTrainedModel, *, tokenizer: PreTrainedTokenizerBase,
                    prompts: Sequence[Sequence[int]], stops: list[int], max_new_tokens: int = ANSWER_TOKENS) -> str | None:
    """The first probe prompt whose greedy answer differs between the merged model and base + adapter."""
    for index, prompt in enumerate(prompts):
        ours, theirs = (_greedy(model, prompt, tokenizer=tokenizer, stops=stops, max_new_tokens=max_new_tokens)
                        for model in (merged, unmerged))
        at = first_difference(ours, theirs)
        if at is not None:
            return (f"the merged model answers probe prompt {index} differently from the base model with the adapter: "
                    f"the greedy tokens first differ at answer token {at}; base + adapter wrote "
                    f"{around(tokenizer, theirs, at)}, the merged model {around(tokenizer, ours, at)}.")
    return None


def _greedy(model: PreTrainedModel, prompt: Sequence[int], *, tokenizer: PreTrainedTokenizerBase, stops: list[int],
            max_new_tokens: int) -> list[int]:
    import torch

    ids = torch.tensor([list(prompt)], device=model.device)
    with torch.no_grad():
        output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                do_sample=False, eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
    return output[0, ids.shape[1]:].tolist()


def check_export(export_dir: str | Path, *, config: StageConfig | None, template: Template,
                 trained_tokenizer: PreTrainedTokenizerBase, adapter: tuple[str, str] | None = None,
                 count: int = PROBE_COUNT) -> ParityReport:
    """Run the gate on `export_dir`; `adapter` is (base model, adapter folder) when the export merged one.
    Raises ParityError naming the first difference; returns what was checked, for the manifest."""
    from tuneline.core.models.loading import load_model, load_tokenizer
    from tuneline.core.templates.conversation import stop_token_ids

    exported = load_tokenizer(export_dir)
    probes = probe_conversations(config, count=count)
    rendering = check_rendering(exported, template=template, trained=trained_tokenizer, probes=probes)
    problem = rendering.problem
    if problem is None and adapter is not None:
        from tuneline.core.evaluation.heldout import load_for_inference

        prompts = [encode_prompt(template, trained_tokenizer, Conversation(p.conversation.prompt, system=p.conversation.system))
                   for p in probes]
        base, adapter_dir = adapter
        unmerged = load_for_inference(base, adapter_path=adapter_dir, vocab_size=len(trained_tokenizer))
        merged = load_model(export_dir).eval()
        problem = answers_problem(merged, unmerged, tokenizer=trained_tokenizer, prompts=prompts,
                                  stops=stop_token_ids(template, trained_tokenizer))
    if problem is not None:
        raise ParityError("The export failed the train/serve parity check, so it was not written: "
                          f"{problem} Serving it would prompt or answer otherwise than the trained model; fix the "
                          "template or tokenizer the export starts from, or re-export.")
    return ParityReport(probes=len(probes), answers_checked=adapter is not None, warning=rendering.warning)


@dataclass(frozen=True)
class ParityReport:
    """What the gate checked, for the export's manifest, and the segmentation warning if any."""

    probes: int
    answers_checked: bool
    warning: str | None = None

    def metrics(self) -> dict[str, float]:
        return {"parity_probes": float(self.probes), "parity_answers_checked": float(self.answers_checked),
                "parity_segmentation_differs": float(self.warning is not None)}
