"""Golden rows of the chat templates on LLaMA-Factory's demo datasets (pretraining text, alpaca,
multi-turn sharegpt with tools, pairwise), written by LLaMA-Factory 0.9.5's own preprocessing
(get_train_args, load_tokenizer, get_template_and_fix_tokenizer, get_dataset) into tests/data/golden/,
in the format tests/core/templates/test_golden.py reads. Run with LLaMA-Factory's Python from the
repository root:

    /work/lfvenv/bin/python tests/data/make_template_golden.py tests/data/golden

`write_golden` is shared with make_template_keys_golden.py, which writes the template keys' goldens.
"""
import copy
import json
import sys
import tempfile
from pathlib import Path

from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.data.template import TEMPLATES
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer

SHARED = Path(__file__).resolve().parents[3] / "shared"
DEMO_DATA = SHARED / "llamafactory" / "data"
EXAMPLE_COLUMNS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels", "input_ids", "labels")
"""The columns of LLaMA-Factory's encoded rows a golden keeps (attention masks follow from the ids)."""

PAIRS = [  # (tokenizer, template): each tokenizer with its own template, and others' templates on it
    ("gpt2", "default"), ("llama2", "llama2"), ("llama3", "default"), ("llama3", "llama3"), ("mistral-v0.3", "mistral"),
    ("phi3.5", "phi"), ("qwen2.5", "chatml"), ("qwen2.5", "qwen"), ("qwen2.5", "vicuna"),
]
KINDS = {  # kind: (stage, cutoff_len, demo dataset, row indices)
    "pt": ("pt", 128, "c4_demo", [0, 1, 2, 3]),
    "sft": ("sft", 1024, "alpaca_en_demo", [0, 1, 2, 3]),
    "sft_cut": ("sft", 48, "alpaca_en_demo", [4, 5, 6]),  # long enough to be cut by the per-turn budget
    "sft_multiturn": ("sft", 1024, "glaive_toolcall_en_demo", [0, 1, 2]),
    "pairwise": ("rm", 512, "dpo_en_demo", [0, 1, 2]),
}
LEFT_OUT = {("llama3", "llama3", "sft_multiturn")}
"""llama3's own tool prompt writes today's date ("Today Date: 06 Dec 2026"), so its tokens change from day to
day (tuneline refuses tools with that format); the llama3 template's tool turns are written with tool_format
qwen instead (make_template_keys_golden.py)."""


def demo_rows(dataset: str, indices: list[int]) -> tuple[list, dict]:
    """The rows at `indices` of a demo dataset and its dataset_info.json entry without `file_name`."""
    entry = json.loads((DEMO_DATA / "dataset_info.json").read_text(encoding="utf-8"))[dataset]
    path = DEMO_DATA / entry["file_name"]
    text = path.read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else json.loads(text)
    return [rows[i] for i in indices], {key: value for key, value in entry.items() if key != "file_name"}


def llamafactory_encoding(tokenizer_name: str, arguments: dict, rows: list, entry: dict):
    """LLaMA-Factory's encoded rows of `rows` (read through `entry`) under `arguments`, its fixed tokenizer and
    its model arguments (make_token_golden.py records the special tokens they add).

    get_template_and_fix_tokenizer writes default_system, tool_format and the thinking keys into the
    registry's own template, so a key of one case would leak into the next case of this process with that
    template; each case gets the template as registered and the registry is given it back afterwards."""
    pristine = copy.deepcopy(TEMPLATES[arguments["template"]])
    try:
        return _encoding(tokenizer_name, arguments, rows, entry)
    finally:
        TEMPLATES[arguments["template"]] = pristine


def _encoding(tokenizer_name: str, arguments: dict, rows: list, entry: dict):
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        (data / "rows.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
        (data / "dataset_info.json").write_text(json.dumps({"golden": {**entry, "file_name": "rows.json"}}), encoding="utf-8")
        model_args, data_args, training_args, _, _ = get_train_args({
            **arguments, "model_name_or_path": str(SHARED / "tokenizers" / tokenizer_name), "dataset_dir": str(data),
            "output_dir": str(data / "out"), "report_to": "none", "overwrite_cache": True,
            "preprocessing_num_workers": None})
        tokenizer = load_tokenizer(model_args)["tokenizer"]
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        dataset = get_dataset(template, model_args, data_args, training_args, stage=arguments["stage"],
                              tokenizer=tokenizer)["train_dataset"]
        examples = [{column: row[column] for column in EXAMPLE_COLUMNS if column in row} for row in dataset]
    return examples, tokenizer, model_args


def write_golden(out: Path, *, script: str, tokenizer_name: str, kind: str, arguments: dict, dataset: str,
                 row_indices: list[int], entry: dict, rows: list, rows_note: str | None = None) -> None:
    """One golden file, `{tokenizer}__{template}__{kind}.json`, naming `script` as the command that wrote it."""
    examples, tokenizer, _ = llamafactory_encoding(tokenizer_name, arguments, rows, entry)
    record = {
        "llamafactory_version": "0.9.5",
        "command": f"/work/lfvenv/bin/python tests/data/{script} tests/data/golden (LLaMA-Factory's get_train_args, "
                   "load_tokenizer, get_template_and_fix_tokenizer, get_dataset)",
        "tokenizer": tokenizer_name, "template": arguments["template"], "kind": kind, "arguments": arguments,
        "dataset": dataset, "row_indices": row_indices, "dataset_info_entry": entry, "rows": rows,
        "examples": examples, "eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token,
    }
    if rows_note is not None:
        record["rows_note"] = rows_note
    path = out / f"{tokenizer_name}__{arguments['template']}__{kind}.json"
    path.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def base_arguments(stage: str, template: str, cutoff_len: int) -> dict:
    return {"stage": stage, "do_train": True, "finetuning_type": "lora", "template": template, "dataset": "golden",
            "cutoff_len": cutoff_len}


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for tokenizer_name, template in PAIRS:
        for kind, (stage, cutoff_len, dataset, indices) in KINDS.items():
            if (tokenizer_name, template, kind) in LEFT_OUT:
                continue
            rows, entry = demo_rows(dataset, indices)
            write_golden(target, script="make_template_golden.py", tokenizer_name=tokenizer_name, kind=kind,
                         arguments=base_arguments(stage, template, cutoff_len), dataset=dataset, row_indices=indices,
                         entry=entry, rows=rows)
