"""Token-exact against LLaMA-Factory 0.9.5: every row of tests/data/golden/ encodes to its ids.

Each golden file holds raw rows (demo rows, or the rows of tests/data/make_token_golden.py), their
dataset_info.json entry, the arguments (`{shared}` standing for the shared assets folder) and the
input_ids/labels that LLaMA-Factory's own preprocessing wrote for them (the file records the
command). The rows go through tuneline's whole path: the registry reader and converter, the
template with its tokenizer fixes, and the batch encoder the tokenize stage runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "data" / "golden"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))
_STAGES = {"sft": "sft", "rm": "rm", "pt": "pt"}


@pytest.fixture(scope="module")
def prepared(shared_dir: Path):
    """`prepared(config, tokenizer_name)`: the tokenizer and template as the tokenize stage
    prepares them. The tokenizer is prepared once per tokenizer and template of the module (the
    template keys change no token the tokenizer is fixed for); the keys are then applied to the
    template as the stage applies them."""
    import dataclasses

    from tuneline.core.data.tokenization import prepare_tokenizer, stage_template

    cache: dict[tuple[str, str], tuple] = {}

    def _prepared(config, tokenizer_name: str):
        model = config.model
        pair = (tokenizer_name, config.data.template, model.split_special_tokens, model.add_tokens, model.add_special_tokens,
                model.new_special_tokens_config)
        if pair not in cache:
            named = dataclasses.replace(config.data, default_system=None, tool_format=None, enable_thinking=True,
                                        preserve_thinking=False)
            tokenizer, template, _, _ = prepare_tokenizer(dataclasses.replace(config, data=named),
                                                       shared_dir / "tokenizers" / tokenizer_name)
            cache[pair] = (tokenizer, template)
        tokenizer, template = cache[pair]
        return tokenizer, stage_template(config, tokenizer, named=template)

    return _prepared


def _encode(golden: dict, prepared, dataset_dir: Path, shared_dir: Path) -> list[dict]:
    from tuneline.core.data.encoding import EncodingSpec, encode_batch
    from tuneline.core.data.tokenization import read_rows
    from tuneline.core.stages.registry import build_stage_config, stage_kind

    (dataset_dir / "rows.json").write_text(json.dumps(golden["rows"], ensure_ascii=False), encoding="utf-8")
    entry = {**golden["dataset_info_entry"], "file_name": "rows.json"}
    (dataset_dir / "dataset_info.json").write_text(json.dumps({"golden": entry}), encoding="utf-8")
    arguments = {key: value.replace("{shared}", str(shared_dir)) if isinstance(value, str) else value  # the assets folder
                 for key, value in golden["arguments"].items()}
    config = build_stage_config({**arguments, "dataset": "golden", "dataset_dir": str(dataset_dir),
                                 "stage": _STAGES[arguments["stage"]]})
    tokenizer, template = prepared(config, golden["tokenizer"])
    spec = EncodingSpec.from_config(config, template=template, examples=stage_kind(config.finetuning.stage).examples)
    examples, _ = encode_batch(read_rows(["golden"], config), spec=spec, tokenizer=tokenizer)
    return examples


def test_golden_files_cover_every_tokenizer(shared_dir: Path):
    tokenizers = {path.name for path in (shared_dir / "tokenizers").iterdir() if (path / "tokenizer.json").is_file()}
    covered = {json.loads(path.read_text(encoding="utf-8"))["tokenizer"] for path in GOLDEN_FILES}
    assert tokenizers <= covered
    assert all(json.loads(path.read_text(encoding="utf-8"))["llamafactory_version"] == "0.9.5" for path in GOLDEN_FILES)


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[path.stem for path in GOLDEN_FILES])
def test_ids_equal_llamafactory(path: Path, prepared, tmp_path: Path, shared_dir: Path):
    golden = json.loads(path.read_text(encoding="utf-8"))
    examples = _encode(golden, prepared, tmp_path, shared_dir)
    expected = golden["examples"]
    assert len(examples) == len(expected)
    for i, (ours, theirs) in enumerate(zip(examples, expected)):
        for column, ids in theirs.items():
            assert ours[column] == ids, f"example {i}, column {column}"


@pytest.mark.parametrize(("tokenizer_name", "template_name", "warns"), [
    ("llama2", "llama2", True), ("llama3", "default", True), ("qwen2.5", "vicuna", True), ("qwen2.5", "chatml", True),
    ("phi3.5", "phi", False), ("qwen2.5", "qwen", False), ("llama3", "llama3", False),
])
def test_llamafactory_combinations_train_with_a_warning_where_they_differ(shared_dir: Path, tokenizer_name, template_name,
                                                                          warns):
    from tuneline.core.data.tokenization import prepare_tokenizer
    from tuneline.core.stages.registry import build_stage_config

    config = build_stage_config({"stage": "sft", "template": template_name})
    _, _, warning, _ = prepare_tokenizer(config, shared_dir / "tokenizers" / tokenizer_name)
    assert (warning is not None) == warns
    if warns:
        assert warning.startswith(f"template '{template_name}' does not write what this tokenizer's own chat template")
        assert "first differ at position" in warning and "(ids [" in warning


def test_added_tokens_and_split_special_tokens_as_llamafactory_reads_them(shared_dir: Path):
    """tokens_cfg.yaml gives LLaMA-Factory's special tokens in its order; an added token is one id in
    LLaMA-Factory's rows; split_special_tokens writes special-token text as pieces."""
    from tuneline.core.config.added_tokens import added_tokens
    from tuneline.core.stages.registry import build_stage_config

    added = json.loads((GOLDEN_DIR / "qwen2.5__qwen__sft_added_tokens.json").read_text(encoding="utf-8"))
    config_file = added["arguments"]["new_special_tokens_config"].replace("{shared}", str(shared_dir))
    tokens = added_tokens(build_stage_config({"stage": "sft", "new_special_tokens_config": config_file}).model)
    assert list(tokens.special) == added["added_special_tokens"] and len(tokens.special) == 16
    first_new = added["tokenizer_length"] - 18  # <think>, </think> and the 16 of the file
    written = {token for example in added["examples"] for token in example["input_ids"] if token >= first_new}
    assert {first_new, first_new + 1, first_new + 2} <= written  # <think>, </think>, <|START_OF_SVG|>

    split, whole = (json.loads((GOLDEN_DIR / f"llama2__llama2__sft_{name}.json").read_text(encoding="utf-8"))
                    for name in ("split", "nosplit"))
    eos_id = 2
    assert [example["input_ids"].count(eos_id) for example in whole["examples"]] == [3, 3]  # two in the text, one closing
    assert [example["input_ids"].count(eos_id) for example in split["examples"]] == [1, 1]  # the closing eos only


def test_the_tokenize_stage_applies_the_template_keys_itself(shared_dir: Path, tmp_path: Path):
    """One golden file through `prepare_tokenizer` with its keys, as the tokenize stage runs it."""
    from tuneline.core.data.tokenization import prepare_tokenizer

    golden = json.loads((GOLDEN_DIR / "qwen2.5__qwen3__sft_thinking_false.json").read_text(encoding="utf-8"))
    assert golden["arguments"]["enable_thinking"] is False
    examples = _encode(golden, lambda config, name: prepare_tokenizer(config, shared_dir / "tokenizers" / name)[:2], tmp_path, shared_dir)
    assert [{column: example[column] for column in theirs} for example, theirs in zip(examples, golden["examples"])] == \
        golden["examples"]
