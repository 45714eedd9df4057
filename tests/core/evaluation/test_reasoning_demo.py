"""The reasoning demo (data/generate_reasoning_data.py): its datasets load through tuneline's dataset_info,
no problem appears in two files, the same seed writes the same files, and every worked solution gets full
reward from the verifiable rewards it is written for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_reasoning_demo_is_consistent_with_the_rewards_that_score_it(tmp_path: Path):
    from tuneline.core.config import StageConfig
    from tuneline.core.data.tokenization import read_rows
    from tuneline.core.evaluation.verifiable import answer_match, think_answer_format
    from tuneline.core.stages.registry import build_stage_config

    sys.path.insert(0, str(ROOT / "data"))
    from generate_reasoning_data import main

    main(["--out-dir", str(tmp_path / "a"), "--problems", "40"])
    main(["--out-dir", str(tmp_path / "b"), "--problems", "40"])
    names = sorted(path.name for path in (tmp_path / "a").iterdir())
    assert all((tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes() for name in names)
    config: StageConfig = build_stage_config({"dataset_dir": str(tmp_path / "a"), "template": "default"})
    solved, prompts, held_out = (read_rows([name], config) for name in ("reasoning_sft", "reasoning_prompts", "reasoning_heldout"))
    assert (len(solved), len(prompts), len(held_out)) == (40, 20, 10)
    questions = [[row["prompt"][-1]["content"] for row in rows] for rows in (solved, prompts, held_out)]
    assert len(set().union(*questions)) == 70  # no problem twice
    completions = [row["response"][0]["content"] for row in solved]
    answers = [str(eval(question.removeprefix("What is ").removesuffix("?"))) for question in questions[0]]  # noqa: S307
    assert answer_match(questions[0], completions, answer=answers) == [1.0] * 40
    assert think_answer_format(questions[0], completions) == [1.0] * 40
    facts = [json.loads(line)["text"] for line in (tmp_path / "a" / "reasoning_pretrain.jsonl").read_text().splitlines()]
    assert len(facts) == 40 and all(fact.split(" = ")[1] == answer for fact, answer in zip(facts, answers))
