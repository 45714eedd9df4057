"""Which dataset entries give rows of the shape a stage encodes, and what to set when one does not.

Whether a dataset's rows can have a shape (`StageKind.examples`) is decided by its entry in
dataset_info.json alone, so a dataset of the wrong shape is refused by its entry before any row is
read, naming the shape the stage needs and the entry settings that give it. LLaMA-Factory refuses a
`"ranking": true` dataset outside its pairwise stages and the others within them ("The dataset is
not applicable in the current training stage."); a dataset without `kto_tag` under stage kto has
every row dropped there. Online RL and prediction read only the prompts, so every dataset serves them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneline.core.data.dataset_info import get_dataset_attrs
from tuneline.core.data.row_streams import dataset_names
from tuneline.core.data.sources import dataset_file, entry_label
from tuneline.core.errors import DataError

if TYPE_CHECKING:
    from tuneline.core.config import StageConfig
    from tuneline.core.data.dataset_attr import DatasetAttr

NEEDS = {
    "pairwise": "pairwise rows, each a prompt with a chosen and a rejected response",
    "feedback": "feedback rows, each a prompt with one response and a 'kto_tag' saying whether the response is "
                "desirable",
    "supervised": "supervised rows, each a conversation that ends with the one response to train on",
    "pretrain": "documents, the text of each row's first message",
}
"""What each example shape is encoded from, for messages."""

PAIRWISE_SETTINGS = ('give its entry "ranking": true and map the preferred and the rejected response in "columns" as '
                     '"chosen" and "rejected" (alpaca: with the instruction as "prompt"; sharegpt: with the conversation '
                     'up to the last user message as "messages")')
FEEDBACK_SETTINGS = ('map a column of true/false values in its "columns" as "kto_tag" (alpaca: with the answer as '
                     '"response"; sharegpt: the tag marks the last assistant message of "messages")')
UNRANKED_SETTINGS = ('train it with a pairwise stage (rm, or dpo and its pref_loss variants orpo and simpo), or '
                     'remove "ranking": true from its entry and map the one response (alpaca: "response"; sharegpt: '
                     'the last assistant message of "messages")')


def check_shapes(config: StageConfig, *, examples: str) -> None:
    """Refuse, in one DataError, every training and evaluation dataset whose entry cannot give `examples` rows."""
    names = dict.fromkeys(dataset_names(config.data.dataset) + dataset_names(config.data.eval_dataset))
    attrs = get_dataset_attrs(list(names), config.data.dataset_dir) if names else []
    problems = [problem for attr in attrs if (problem := shape_problem(attr, examples=examples, config=config))]
    if problems:
        raise DataError(" ".join(problems))


def shape_problem(attr: DatasetAttr, *, examples: str, config: StageConfig) -> str | None:
    """Why `attr`'s rows cannot be encoded as `examples` for the stage of `config`, with the entry settings
    that would give them; None when they can."""
    if examples == "pairwise" and not attr.ranking:
        has, settings = "one response per row", PAIRWISE_SETTINGS
    elif examples == "feedback" and "kto_tag" not in attr.columns:
        has = "preference pairs ('\"ranking\": true')" if attr.ranking else "rows without a 'kto_tag'"
        settings = FEEDBACK_SETTINGS + (' and remove "ranking": true' if attr.ranking else "")
    elif examples in ("supervised", "pretrain") and attr.ranking:
        has, settings = "preference pairs ('\"ranking\": true')", UNRANKED_SETTINGS
    else:
        return None
    stage = f"'stage: {config.finetuning.stage}'" if config.finetuning.stage else "the stage"
    return (f"{entry_label(attr, config.data.dataset_dir)} ({_source(attr, config)}) holds {has}, and {stage} "
            f"trains on {NEEDS[examples]}: {settings}; or name a dataset that has that shape.")


def _source(attr: DatasetAttr, config: StageConfig) -> str:
    if attr.load_from == "hf_hub":
        return f"hub dataset '{attr.hf_hub_url}'"
    return f"file {dataset_file(attr, config.data.dataset_dir)}" if attr.file_name else "no file_name"
