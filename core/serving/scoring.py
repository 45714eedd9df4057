"""Serving a reward model: LLaMA-Factory's `POST /v1/score/evaluation`.

A request names texts already rendered (`messages`: a list of strings, each a prompt and reply as
the reward model was trained to read them) and an optional `max_length`; the answer is one score
per text, `{"id", "model", "scores"}`. As LLaMA-Factory scores them: each text tokenized without
special tokens, cut to `max_length` (default: the model's context length; a larger one is refused
with 400, as is a request of more texts than `RequestLimits.score_texts`), and read by the scoring
head at its last token (`core.evaluation.reward.score`, which PPO's rewards use too). A reward
model generates nothing, so chat completions on it are 405, as the score endpoint is on a model
that generates.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.serving.protocol import RequestError, RequestLimits, json_object

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tuneline.core.config import ModelConfig
    from tuneline.core.inference.chat import ModelSource

SCORING_ARCHITECTURE = "ForSequenceClassification"
SCORING_TASK = "SEQ_CLS"


@dataclass(frozen=True)
class ScoreRequest:
    texts: tuple[str, ...]
    max_length: int | None = None
    model: str | None = None


def parse_score_request(raw: bytes, *, context_length: int, limits: RequestLimits = RequestLimits()) -> ScoreRequest:
    """The request in `raw`, or a RequestError naming the field that is wrong; `context_length` is the reward
    model's, the most tokens a text may be cut to."""
    body = json_object(raw)
    texts = body.get("messages")
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) and text for text in texts):
        raise RequestError("'messages' must be a non-empty list of non-empty strings, each a text to score.", param="messages")
    if len(texts) > limits.score_texts:
        raise RequestError(f"'messages' holds {len(texts)} texts and this server scores at most {limits.score_texts} in one "
                           "request (API_MAX_SCORE_TEXTS); send them in several requests.", param="messages")
    max_length = body.get("max_length")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise RequestError(f"'max_length' must be a positive whole number, got {json.dumps(max_length)}.", param="max_length")
    if max_length is not None and max_length > context_length:
        raise RequestError(f"'max_length' is {max_length}, above the reward model's context of {context_length} tokens; "
                           f"send at most {context_length}, or leave it out to cut each text to the context.",
                           param="max_length", code="context_length_exceeded")
    model = body.get("model")
    return ScoreRequest(texts=tuple(texts), max_length=max_length, model=model if isinstance(model, str) else None)


class ScoringEngine:
    """A reward model and its tokenizer; one scoring at a time."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self._lock = threading.Lock()

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config.get_text_config(), "max_position_embeddings", 1024))

    def score(self, request: ScoreRequest) -> list[float]:
        from tuneline.core.evaluation.reward import score

        limit = request.max_length or self.context_length
        with self._lock:
            ids = [self.tokenizer.encode(text, add_special_tokens=False)[:limit] for text in request.texts]
            return [float(value) for value in score(self.model, self.tokenizer, ids)]


def is_reward_model(source: ModelSource) -> bool:
    """Whether `source` holds a reward model (an rm stage's output): a LoRA adapter of the scoring
    task, or full weights of a sequence-classification class."""
    if source.adapter is not None:
        return _json(source.adapter / "adapter_config.json").get("task_type") == SCORING_TASK
    architectures = _json(Path(source.model) / "config.json").get("architectures") or []
    return any(str(name).endswith(SCORING_ARCHITECTURE) for name in architectures)


def load_scoring_engine(source: ModelSource, *, model_config: ModelConfig) -> ScoringEngine:
    """The reward model of `source` loaded as the rm stage's evaluation loads it (on the GPU when there is one)."""
    import torch

    from tuneline.core.models.loading import load_reward_model

    path, base = (source.adapter, source.model) if source.adapter is not None else (source.model, None)
    model, tokenizer = load_reward_model(path, base_model=base, model=model_config)
    if torch.cuda.is_available():
        model = model.to("cuda")
    if tokenizer.pad_token_id is None:  # scoring pads a batch; the head reads each text's own last token
        tokenizer.pad_token = tokenizer.eos_token
    return ScoringEngine(model, tokenizer)


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
