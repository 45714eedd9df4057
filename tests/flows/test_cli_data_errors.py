"""`tuneline train` on bad data, for every stage kind: exit status 2 and one paragraph that names the dataset (its
entry in dataset_info.json), the file and the row, with no traceback; a dataset of another shape than the stage
trains on is refused by its entry, with the settings that give the shape. Each run ends before training.

Each case runs the command's `main` in this process, the worker's run without its start: a process per case
would spend seconds on its interpreter and on a worker's imports that the refusal makes useless."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # a tokenization per case: the core row checks stay in the fast tier (tests/core/data)

BAD_TOOLS = '{"name": "lookup", '  # a row's tools cut off mid-object: every template-rendering stage refuses it
TOOLS = {"tools": "tools"}


def alpaca(count: int, *, bad: int, **fields) -> list[dict]:
    """`count` alpaca rows; row `bad` (from 1) has tools that are not JSON."""
    return [{"instruction": f"question {n}", "tools": BAD_TOOLS if n == bad else "", **fields} for n in range(1, count + 1)]


def sharegpt_pairs(count: int, *, bad: int) -> list[dict]:
    return [{"conversations": [{"from": "human", "value": f"question {n}"}], "chosen": {"from": "gpt", "value": "yes"},
             "rejected": {"from": "gpt", "value": "no"}, "tools": BAD_TOOLS if n == bad else ""} for n in range(1, count + 1)]


RANKED = {"ranking": True, "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected", **TOOLS}}
PROMPTS = {"columns": {"prompt": "instruction", "response": "output", **TOOLS}}

# stage kind: (stage keys, {dataset name: (entry, rows)}, the dataset, file and row the message names)
CASES = {
    "pt": ({"stage": "pt"}, {"corpus": ({"columns": {"prompt": "text"}},
                                        [{"text": "one document"}, {"text": "another"}, {"text": 12}])},
           ("corpus", "row 3 (line 3)")),
    "sft": ({"stage": "sft"}, {"answers": ({}, [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d"},
                                                {"instruction": "e", "output": None}])},
            ("answers", "row 3 (line 3)")),
    "rm": ({"stage": "rm"}, {"pairs": ({"formatting": "sharegpt", "ranking": True,
                                         "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected",
                                                     **TOOLS}}, sharegpt_pairs(4, bad=3))},
           ("pairs", "row 3 (line 3)")),
    "dpo": ({"stage": "dpo", "mix_strategy": "interleave_under"},
            {"pairs_a": (RANKED, alpaca(4, bad=0, chosen="yes", rejected="no")),
             "pairs_b": (RANKED, alpaca(4, bad=2, chosen="yes", rejected="no"))},
            ("pairs_b", "row 2 (line 2)")),
    "orpo": ({"stage": "dpo", "pref_loss": "orpo"}, {"pairs": (RANKED, alpaca(4, bad=3, chosen="yes", rejected="no"))},
             ("pairs", "row 3 (line 3)")),
    "kto": ({"stage": "kto"}, {"tagged": ({"columns": {"prompt": "instruction", "response": "output", "kto_tag": "good",
                                                       **TOOLS}}, alpaca(4, bad=3, output="yes", good=True))},
            ("tagged", "row 3 (line 3)")),
    "ppo": ({"stage": "ppo", "reward_model": "{model}"}, {"prompts": (PROMPTS, alpaca(4, bad=3, output="1"))},
            ("prompts", "row 3 (line 3)")),
    "grpo": ({"stage": "grpo", "reward_funcs": "answer_match"}, {"prompts": (PROMPTS, alpaca(4, bad=4, output="1"))},
             ("prompts", "row 4 (line 4)")),
    "rloo": ({"stage": "rloo", "reward_funcs": "answer_match"}, {"prompts": (PROMPTS, alpaca(4, bad=1, output="1"))},
             ("prompts", "row 1 (line 1)")),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One TUNELINE_CACHE for the module: what a first run computes once for every later one (the trainer
    arguments' table) is computed once here too; a refused run leaves nothing else in it."""
    return tmp_path_factory.mktemp("cache")


def train(tmp_path: Path, model: Path, stage_keys: dict, datasets: dict[str, tuple[dict, list[dict]]], *,
          cache: Path) -> subprocess.CompletedProcess:
    """`tuneline train` on `datasets` (each written as NAME.jsonl beside its entry), in this process."""
    from conftest import run_cli_here, train_in_this_process

    data = tmp_path / "data"
    data.mkdir()
    for name, (_, rows) in datasets.items():
        (data / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (data / "dataset_info.json").write_text(json.dumps({name: {"file_name": f"{name}.jsonl", **entry}
                                                        for name, (entry, _) in datasets.items()}))
    keys = {key: value.format(model=model) if isinstance(value, str) else value for key, value in stage_keys.items()}
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model), "finetuning_type": "lora", "template": "default",
                                      "dataset": ",".join(datasets), "dataset_dir": str(data), "cutoff_len": 64,
                                      "output_dir": str(tmp_path / "out"), "max_steps": 2, **keys}))
    (tmp_path / "cache").symlink_to(cache)  # run_cli_here's TUNELINE_CACHE: the module's
    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)  # no worker started to import while the data is tokenized
        return run_cli_here("train", str(config), cwd=tmp_path)


def assert_one_paragraph_exit_2(result: subprocess.CompletedProcess) -> str:
    """The error's paragraph: one line, the last of stderr (the worker that was importing meanwhile may have
    logged before it)."""
    output = result.stderr.strip()
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    message = output.splitlines()[-1]
    assert message.startswith("error: ") and output.count("error: ") == 1, output
    return message


@pytest.mark.parametrize("kind", list(CASES))
def test_a_bad_row_is_refused_naming_its_dataset_file_and_row(kind: str, tiny_base: Path, cache: Path, tmp_path: Path):
    stage_keys, datasets, (dataset, row) = CASES[kind]
    message = assert_one_paragraph_exit_2(train(tmp_path, tiny_base, stage_keys, datasets, cache=cache))
    data = tmp_path / "data"
    assert f"dataset '{dataset}' in {data / 'dataset_info.json'}: {row} of {data / (dataset + '.jsonl')}: " in message
    assert not (tmp_path / "out").exists()  # refused before training


@pytest.mark.parametrize(("stage", "entry", "rows", "fragments"), [
    ("rm", {}, [{"instruction": "a", "output": "b"}],  # LLaMA-Factory's alpaca_en_demo under stage rm
     ["holds one response per row", "'stage: rm' trains on pairwise rows, each a prompt with a chosen and a rejected "
      "response", 'give its entry "ranking": true', 'as "chosen" and "rejected"']),
    ("kto", RANKED, alpaca(1, bad=0, chosen="yes", rejected="no"),
     ["holds preference pairs", "'stage: kto' trains on feedback rows", 'in its "columns" as "kto_tag"',
      'remove "ranking": true']),
])
def test_a_dataset_of_another_shape_names_the_shape_the_stage_needs_and_the_settings_that_give_it(
        stage: str, entry: dict, rows: list[dict], fragments: list[str], tiny_base: Path, cache: Path, tmp_path: Path):
    message = assert_one_paragraph_exit_2(train(tmp_path, tiny_base, {"stage": stage}, {"mine": (entry, rows)}, cache=cache))
    data = tmp_path / "data"
    assert f"dataset 'mine' in {data / 'dataset_info.json'} (file {data / 'mine.jsonl'})" in message
    for fragment in fragments:
        assert fragment in message, message
