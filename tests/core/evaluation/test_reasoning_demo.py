"""The reasoning demo (data/generate_reasoning_data.py): its datasets load through tuneline's dataset_info,
no held-out problem is trained on, the same seed writes the same files, worked answers get full reward
from the verifiable rewards and prose answers none."""

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

    main(["--out-dir", str(tmp_path / "a"), "--held-out", "30", "--fact-passes", "2"])
    main(["--out-dir", str(tmp_path / "b"), "--held-out", "30", "--fact-passes", "2"])
    names = sorted(path.name for path in (tmp_path / "a").iterdir())
    assert all((tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes() for name in names)
    config: StageConfig = build_stage_config({"dataset_dir": str(tmp_path / "a"), "template": "chatml"})
    solved, prompts, held_out = (read_rows([name], config) for name in ("reasoning_sft", "reasoning_prompts", "reasoning_heldout"))
    table = 100 + 55 + 36  # sums and differences of digits (no negative one), products to 5 x 5
    assert (len(solved), len(prompts), len(held_out)) == (table - 30, table - 30, 30)
    questions = [[row["prompt"][-1]["content"] for row in rows] for rows in (solved, prompts, held_out)]
    assert questions[0] == questions[1] and not set(questions[2]) & set(questions[0])  # held-out problems are new
    answers = [str(eval(question.removeprefix("What is ").removesuffix("?"))) for question in questions[0]]  # noqa: S307
    assert [row["response"][0]["content"] for row in prompts] == answers
    replies = [row["response"][0]["content"] for row in solved]
    worked = [think_answer_format(questions[0], [reply])[0] == 1.0 for reply in replies]
    assert worked == [i % 3 == 0 for i in range(len(replies))]  # a third in the checkable shape
    assert answer_match(questions[0], replies, answer=answers) == [float(w) for w in worked]  # prose is not checkable
    assert all(reply.endswith(f"so the answer is {answer}.") for reply, answer, w in zip(replies, answers, worked) if not w)
    texts = [json.loads(line)["text"] for line in (tmp_path / "a" / "reasoning_pretrain.jsonl").read_text().splitlines()]
    assert len(texts) == 2 * table and len(set(texts[:table])) == table
    assert all(text.startswith("<|im_start|>user\nWhat is ") and text.endswith("<|im_end|>") for text in texts)
