"""Golden rows of the template keys (default_system, tool_format, enable_thinking, preserve_thinking,
mask_history), written by LLaMA-Factory 0.9.5's own preprocessing (get_train_args, load_tokenizer,
get_template_and_fix_tokenizer, get_dataset) into tests/data/golden/, in the format
tests/core/templates/test_golden.py reads. Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_template_keys_golden.py tests/data/golden

The thinking keys need rows with thoughts, which the demo datasets lack: their rows are given some
(each file's `rows_note` says how).
"""
import copy
import sys
from pathlib import Path

from make_template_golden import base_arguments, demo_rows, write_golden

SCRIPT = "make_template_keys_golden.py"
TOOL_FORMATS = ["default", "gemma4", "glm4", "glm4_moe", "lfm2", "ling", "minimax1", "minimax2", "mistral", "qwen",
                "qwen3_5", "seed_oss"]
SFT_THOUGHTS_NOTE = ("glaive_toolcall_en_demo rows 0-2, every other gpt reply given a thought "
                     "'<think>\\nReply k: think about it.\\n</think>\\n\\n'")
PAIRWISE_THOUGHTS_NOTE = ("dpo_en_demo rows 0-1, each given an earlier turn after its system message (human 'Hello.', "
                          "gpt with a thought) and a thought in front of the chosen reply")
EARLIER_TURN = [  # the turn each pairwise row is given before its own
    {"from": "human", "value": "Hello."},
    {"from": "gpt", "value": "<think>\nAn earlier thought.\n</think>\n\n<think>\nGreet back.\n</think>\n\nHello! How can I help?"},
]
CHOSEN_THOUGHT = "<think>\nThe chosen thought.\n</think>\n\n"


def sft_rows_with_thoughts() -> tuple[list, dict]:
    """glaive_toolcall_en_demo rows 0-2 whose k-th gpt reply, k even, opens with a thought."""
    rows, entry = demo_rows("glaive_toolcall_en_demo", [0, 1, 2])
    rows = copy.deepcopy(rows)
    for row in rows:
        replies = [message for message in row["conversations"] if message["from"] == "gpt"]
        for k, message in enumerate(replies):
            if k % 2 == 0:
                message["value"] = f"<think>\nReply {k}: think about it.\n</think>\n\n" + message["value"]
    return rows, entry


def pairwise_rows_with_thoughts() -> tuple[list, dict]:
    """dpo_en_demo rows 0-1, each with EARLIER_TURN after its system message and a thought before the chosen reply."""
    rows, entry = demo_rows("dpo_en_demo", [0, 1])
    rows = copy.deepcopy(rows)
    for row in rows:
        messages = row["conversations"]
        after_system = 1 if messages[0]["from"] == "system" else 0
        row["conversations"] = messages[:after_system] + copy.deepcopy(EARLIER_TURN) + messages[after_system:]
        row["chosen"]["value"] = CHOSEN_THOUGHT + row["chosen"]["value"]
    return rows, entry


def write_keys_case(out: Path, tokenizer_name: str, template: str, kind: str, keys: dict, *, stage: str = "sft",
                    cutoff_len: int = 1024, dataset: str = "glaive_toolcall_en_demo", indices: list[int] | None = None,
                    thoughts: bool = False) -> None:
    indices = indices or [0, 1, 2]
    if thoughts:
        rows, entry = pairwise_rows_with_thoughts() if stage == "rm" else sft_rows_with_thoughts()
        note = PAIRWISE_THOUGHTS_NOTE if stage == "rm" else SFT_THOUGHTS_NOTE
    else:
        (rows, entry), note = demo_rows(dataset, indices), None
    write_golden(out, script=SCRIPT, tokenizer_name=tokenizer_name, kind=kind,
                 arguments={**base_arguments(stage, template, cutoff_len), **keys}, dataset=dataset, row_indices=indices,
                 entry=entry, rows=rows, rows_note=note)


def write_all(out: Path) -> None:
    for tokenizer_name, template, system in [("llama2", "llama2", "Answer in one line."),
                                             ("llama3", "llama3", "Answer in one line."),
                                             ("qwen2.5", "qwen", "You are a terse assistant.")]:
        write_keys_case(out, tokenizer_name, template, "sft_default_system", {"default_system": system},
                        dataset="alpaca_en_demo")
    for tool_format in TOOL_FORMATS:
        write_keys_case(out, "qwen2.5", "qwen", f"sft_tool_format_{tool_format}", {"tool_format": tool_format})
    write_keys_case(out, "llama3", "llama3", "sft_tool_format_qwen", {"tool_format": "qwen"})
    write_keys_case(out, "mistral-v0.3", "mistral", "sft_tool_format_default", {"tool_format": "default"})
    write_keys_case(out, "gpt2", "default", "sft_tool_format_qwen", {"tool_format": "qwen", "default_system": "Use the tools."})
    for template in ("qwen3", "mimo"):  # the templates that read thoughts
        for thinking in (True, False, None):
            write_keys_case(out, "qwen2.5", template, f"sft_thinking_{str(thinking).lower()}", {"enable_thinking": thinking},
                            thoughts=True)
        for preserve in (True, False):
            write_keys_case(out, "qwen2.5", template, f"sft_mask_history_preserve_{str(preserve).lower()}",
                            {"mask_history": True, "preserve_thinking": preserve}, thoughts=True)
    for thinking in (True, False, None):
        for preserve in (True, False):
            write_keys_case(out, "qwen2.5", "qwen3", f"pairwise_thinking_{str(thinking).lower()}_preserve_{str(preserve).lower()}",
                            {"enable_thinking": thinking, "preserve_thinking": preserve}, stage="rm", cutoff_len=512,
                            dataset="dpo_en_demo", indices=[0, 1], thoughts=True)


if __name__ == "__main__":
    write_all(Path(sys.argv[1]))
