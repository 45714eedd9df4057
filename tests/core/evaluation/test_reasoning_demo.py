"""The reasoning demo (data/generate_reasoning_data.py): its datasets load through tuneline's dataset_info,
no held-out problem is in any corpus the shipped chain trains on, the same seed writes the same files
(the shipped ones included), worked answers get full reward from the verifiable rewards and prose
answers none."""

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
    trained = table - 30
    assert len(texts) == 2 * trained and len(set(texts[:trained])) == trained  # each problem not held out, twice
    assert {text.split("\n")[1].removesuffix("<|im_end|>") for text in texts} == set(questions[0])
    assert all(text.startswith("<|im_start|>user\nWhat is ") and text.endswith("<|im_end|>") for text in texts)


def test_no_held_out_problem_is_in_a_corpus_the_shipped_chain_trains_on(tmp_path: Path):
    """Every dataset a stage of data/reasoning_pipeline.yaml reads to train (the base model's tokenizer
    corpus, pt, sft and grpo) is searched for each held-out question, in the files the generator
    writes with its defaults, which are the shipped files byte for byte."""
    from tuneline.core.pipeline.spec import BaseStage, build_pipeline, read_yaml

    sys.path.insert(0, str(ROOT / "data"))
    from generate_reasoning_data import main

    main(["--out-dir", str(tmp_path)])
    chain = build_pipeline(read_yaml(ROOT / "data/reasoning_pipeline.yaml"), overrides={"dataset_dir": str(tmp_path)})
    trained_on = set()
    for stage in chain.stages:
        names = stage.corpus if isinstance(stage, BaseStage) else stage.config.data.dataset.split(",")
        trained_on |= {name.strip() for name in names}
    assert trained_on == {"reasoning_pretrain", "reasoning_sft", "reasoning_prompts"}
    assert {stage.config.data.eval_dataset for stage in chain.stages if stage.name == "grpo"} == {"reasoning_heldout"}
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    corpora = {name: (tmp_path / info[name]["file_name"]).read_text() for name in trained_on}
    held_out = [row["instruction"] for row in json.loads((tmp_path / "reasoning_heldout.json").read_text())]
    assert len(held_out) == 40
    seen = {question: [name for name, text in corpora.items() if question in text] for question in held_out}
    assert not {question: names for question, names in seen.items() if names}

    shipped = ROOT / "data/reasoning_demo"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(path.name for path in shipped.iterdir())
    assert all((tmp_path / path.name).read_bytes() == path.read_bytes() for path in shipped.iterdir())
