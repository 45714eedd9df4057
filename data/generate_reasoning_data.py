"""Write tuneline's reasoning demo: `python data/generate_reasoning_data.py [--out-dir DIR] [--held-out N]`.

Small arithmetic problems whose answers a program checks, for a tiny model to learn on a CPU: sums
and differences of digits, products up to 5 x 5 ("What is 7 + 5?"). The verifiable rewards score the
worked shape `<think>7 + 5 = 12</think><answer>12</answer>`. The output folder is a dataset_dir:

- `reasoning_pretrain.jsonl`: every problem not held out, answered, as chat transcripts in ChatML
  text, for a `pt` stage: the model learns the arithmetic, and both ways of answering (half the
  answers in the worked shape, half in prose: "7 + 5 = 12, so the answer is 12."). The problems are
  written several times, each in another order: pt concatenates its rows, and a model that saw one
  order only could recall each answer from the rows before it instead of from the question;
- `reasoning_sft.json`: the problems not held out, as chat rows (alpaca columns), a third answered
  in the worked shape and the rest in prose, so the fine-tuned model mostly answers in prose, whose
  answer the rewards cannot check;
- `reasoning_prompts.json`: the same problems with only their `answer`: the prompts an online RL
  stage samples from and rewards; it learns to answer in the shape that can be checked, which on
  the held-out problems raises the pass rate only as far as the answers are right;
- `reasoning_heldout.json`: problems no stage trains on (not in the pre-training, sft or prompt
  files, nor in the corpus the base model's tokenizer is trained on), for the pass rate: a model
  answers them only as far as it generalises from the other problems (7 + 5 from 5 + 7, say).

The same seed always writes the same files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 2718
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
LARGEST = {"+": 9, "-": 9, "*": 5}
"""The largest operand of each operation: sums and differences of digits, products to 5 x 5."""


def table() -> list[tuple[int, str, int]]:
    """Every (a, operation, b) problem of the demo, in a fixed order; a difference is never negative."""
    return [(a, operation, b) for operation, largest in LARGEST.items()
            for a in range(largest + 1) for b in range(largest + 1) if operation != "-" or a >= b]


def question(a: int, operation: str, b: int) -> str:
    return f"What is {a} {operation} {b}?"


def answer(a: int, operation: str, b: int) -> int:
    return OPERATIONS[operation](a, b)


def solution(a: int, operation: str, b: int) -> str:
    """The worked solution, in the shape the think/answer reward scores."""
    return f"<think>{a} {operation} {b} = {answer(a, operation, b)}</think><answer>{answer(a, operation, b)}</answer>"


def prose(a: int, operation: str, b: int) -> str:
    """The same solution in prose, whose final answer the verifiable rewards do not find."""
    return f"{a} {operation} {b} = {answer(a, operation, b)}, so the answer is {answer(a, operation, b)}."


def chat_transcript(user: str, assistant: str) -> str:
    """One exchange as ChatML text (template `chatml`), as chat logs in a pre-training corpus read."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>"


def dataset_info() -> dict[str, dict]:
    return {
        "reasoning_pretrain": {"file_name": "reasoning_pretrain.jsonl", "columns": {"prompt": "text"}},
        "reasoning_sft": {"file_name": "reasoning_sft.json", "columns": {"prompt": "instruction", "response": "output"}},
        "reasoning_prompts": {"file_name": "reasoning_prompts.json", "columns": {"prompt": "instruction", "response": "answer"}},
        "reasoning_heldout": {"file_name": "reasoning_heldout.json", "columns": {"prompt": "instruction", "response": "answer"}},
    }


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("reasoning_demo"))
    parser.add_argument("--held-out", type=int, default=40, help="problems kept for the pass rate")
    parser.add_argument("--fact-passes", type=int, default=16, help="times pt's problems are written, each shuffled")
    parser.add_argument("--worked-every", type=int, default=3, help="every n-th sft answer is in the worked shape")
    options = parser.parse_args(argv)
    everything = table()
    if not 0 < options.held_out < len(everything):
        parser.error(f"--held-out must be between 1 and {len(everything) - 1} (the table has {len(everything)} problems)")
    options.out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    drawn = rng.sample(everything, len(everything))
    trained, held_out = drawn[options.held_out :], drawn[: options.held_out]
    texts = [chat_transcript(question(*p), rng.choice([solution, prose])(*p))
             for _ in range(options.fact_passes) for p in rng.sample(trained, len(trained))]
    (options.out_dir / "reasoning_pretrain.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts),
                                                             encoding="utf-8")
    write_json(options.out_dir / "reasoning_sft.json",
               [{"instruction": question(*p), "output": solution(*p) if i % options.worked_every == 0 else prose(*p)}
                for i, p in enumerate(trained)])
    for name, problems in (("reasoning_prompts", trained), ("reasoning_heldout", held_out)):
        write_json(options.out_dir / f"{name}.json",
                   [{"instruction": question(*p), "answer": str(answer(*p))} for p in problems])
    write_json(options.out_dir / "dataset_info.json", dataset_info())
    print(f"wrote {len(texts)} pt rows, {len(trained)} sft rows and prompts, {len(held_out)} held-out problems to {options.out_dir}")


if __name__ == "__main__":
    main()
