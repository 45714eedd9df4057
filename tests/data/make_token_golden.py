"""Golden rows of the added-token and split_special_tokens keys, written by LLaMA-Factory 0.9.5's
own preprocessing (get_train_args, load_tokenizer, get_template_and_fix_tokenizer, get_dataset)
into tests/data/golden/, in the format tests/core/templates/test_golden.py reads. Run with
LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_token_golden.py tests/data/golden

A `{shared}` in an argument stands for the shared assets folder (`../shared`).
"""
import json
import sys
from pathlib import Path

from make_template_golden import SHARED, llamafactory_encoding

TOKENS_CFG = "{shared}/llamafactory/examples/extras/multi_tokens/tokens_cfg.yaml"

SPECIAL_TEXT_ROWS = [
    {"instruction": "Repeat the markers </s> and <s> exactly.", "input": "", "output": "Here they are: </s> then <s>."},
    {"instruction": "What ends a sequence?", "input": "The text is: done</s>", "output": "The token </s> ends it."},
]
ADDED_TOKEN_ROWS = [
    {"instruction": "Draw a square.", "input": "",
     "output": "<think>a rect</think><|START_OF_SVG|><|start_of_rect|>width=3 height=3<|end_of_rect|><|END_OF_SVG|>"},
    {"instruction": "Draw text in a group: <|start_of_g|>", "input": "",
     "output": "<think>group first</think><|start_of_g|><|start_of_text|>hi<|end_of_text|><|end_of_g|>"},
]
CASES = [  # (file stem, tokenizer, template, rows, extra arguments)
    ("llama2__llama2__sft_split", "llama2", "llama2", SPECIAL_TEXT_ROWS, {"split_special_tokens": True}),
    ("llama2__llama2__sft_nosplit", "llama2", "llama2", SPECIAL_TEXT_ROWS, {"split_special_tokens": False}),
    ("qwen2.5__qwen__sft_added_tokens", "qwen2.5", "qwen", ADDED_TOKEN_ROWS,
     {"add_tokens": "<think>,</think>", "new_special_tokens_config": TOKENS_CFG}),
    ("gpt2__default__sft_added_tokens", "gpt2", "default", ADDED_TOKEN_ROWS,
     {"add_tokens": "<think>, </think>", "add_special_tokens": "<|START_OF_SVG|>,<|END_OF_SVG|>,<|start_of_rect|>"}),
]


def write_case(out: Path, stem: str, tokenizer_name: str, template: str, rows: list, extra: dict) -> None:
    arguments = {"stage": "sft", "do_train": True, "finetuning_type": "lora", "template": template, "dataset": "golden",
                 "cutoff_len": 1024, **extra}
    resolved = {key: value.replace("{shared}", str(SHARED)) if isinstance(value, str) else value for key, value in arguments.items()}
    examples, tokenizer, model_args = llamafactory_encoding(tokenizer_name, resolved, rows, {})
    record = {
        "llamafactory_version": "0.9.5",
        "command": "/work/lfvenv/bin/python tests/data/make_token_golden.py tests/data/golden (LLaMA-Factory's "
                   "get_train_args, load_tokenizer, get_template_and_fix_tokenizer, get_dataset)",
        "tokenizer": tokenizer_name, "template": template, "kind": "sft", "arguments": arguments,
        "dataset": "written by make_token_golden.py", "row_indices": list(range(len(rows))), "dataset_info_entry": {},
        "rows": rows, "examples": examples, "eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token,
        "added_special_tokens": list(model_args.add_special_tokens or []), "tokenizer_length": len(tokenizer),
    }
    (out / f"{stem}.json").write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for case in CASES:
        write_case(target, *case)
