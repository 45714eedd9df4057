"""Write tuneline's reasoning demo: `python data/generate_reasoning_data.py [--out-dir DIR] [--problems N]`.

Small arithmetic problems whose answers a program checks, for a tiny model to learn on a CPU: sums,
differences and products of small numbers ("What is 7 + 5?"). Every solution is written in the shape
the verifiable rewards score, `<think>7 + 5 = 12</think><answer>12</answer>`. The output folder is a
dataset_dir of its own:

- `reasoning_pretrain.jsonl`: facts as plain text ("7 + 5 = 12"), for a `pt` stage;
- `reasoning_sft.json`: problems with their worked solutions (alpaca columns), for `sft`;
- `reasoning_prompts.json`: other problems with only their `answer`, the prompts an online RL stage
  generates from and rewards against;
- `reasoning_heldout.json`: problems none of the others hold, for the pass rate.

The same seed always draws the same problems; no problem appears in two files.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 2718
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
LARGEST = {"+": 20, "-": 20, "*": 9}
"""The largest operand of each operation: sums and differences to 20, products to 9 x 9."""


def problems(rng: random.Random, count: int, *, taken: set[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """`count` new (a, operation, b) problems, none in `taken` (which gains them); a difference is never negative."""
    drawn = []
    while len(drawn) < count:
        operation = rng.choice(list(OPERATIONS))
        a, b = rng.randint(0, LARGEST[operation]), rng.randint(0, LARGEST[operation])
        if operation == "-" and b > a:
            a, b = b, a
        if (a, operation, b) not in taken:
            taken.add((a, operation, b))
            drawn.append((a, operation, b))
    return drawn


def question(a: int, operation: str, b: int) -> str:
    return f"What is {a} {operation} {b}?"


def answer(a: int, operation: str, b: int) -> int:
    return OPERATIONS[operation](a, b)


def solution(a: int, operation: str, b: int) -> str:
    """The worked solution, in the shape the think/answer reward scores."""
    return f"<think>{a} {operation} {b} = {answer(a, operation, b)}</think><answer>{answer(a, operation, b)}</answer>"


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
    parser.add_argument("--problems", type=int, default=160, help="problems with worked solutions (sft); half as many "
                        "prompts for online RL, a quarter as many held out")
    options = parser.parse_args(argv)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    rng, taken = random.Random(SEED), set()
    solved = problems(rng, options.problems, taken=taken)
    prompted = problems(rng, options.problems // 2, taken=taken)
    held_out = problems(rng, options.problems // 4, taken=taken)
    facts = [f"{a} {op} {b} = {answer(a, op, b)}" for a, op, b in solved]
    (options.out_dir / "reasoning_pretrain.jsonl").write_text("".join(json.dumps({"text": fact}) + "\n" for fact in facts),
                                                             encoding="utf-8")
    write_json(options.out_dir / "reasoning_sft.json",
               [{"instruction": question(*p), "output": solution(*p)} for p in solved])
    for name, drawn in (("reasoning_prompts", prompted), ("reasoning_heldout", held_out)):
        write_json(options.out_dir / f"{name}.json", [{"instruction": question(*p), "answer": str(answer(*p))} for p in drawn])
    write_json(options.out_dir / "dataset_info.json", dataset_info())
    print(f"wrote {len(solved)} solved problems, {len(prompted)} prompts and {len(held_out)} held-out problems to {options.out_dir}")


if __name__ == "__main__":
    main()
