"""Supervised tokenization throughput against the raw tokenizer, measured in one process.

    python benchmarks/tokenize_throughput.py [--tokenizer ../shared/tokenizers/qwen2.5] [--rows 1500]

Baseline: `tokenizer.apply_chat_template(messages, tokenize=True)` per row, which is what a plain
transformers script does (it yields ids but no label mask). Measured: tuneline's
`encode_supervised_row` (ids plus labels with the prompt masked, LLaMA-Factory's truncation rule).
Prints rows per second for both and their ratio; above 1.0 means tuneline is faster.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from transformers import AutoTokenizer

from tuneline.core.data.processors import encode_supervised_row
from tuneline.core.data.registry import get_dataset_attrs, load_rows
from tuneline.core.templates import fix_tokenizer, get_template

REPO_ROOT = Path(__file__).resolve().parent.parent


def rows_per_second(function, rows, *, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for row in rows:
            function(row)
        best = min(best, time.perf_counter() - started)
    return len(rows) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=str(REPO_ROOT.parent / "shared/tokenizers/qwen2.5"))
    parser.add_argument("--template", default="qwen")
    parser.add_argument("--rows", type=int, default=1500)
    args = parser.parse_args()

    data_dir = REPO_ROOT / "data"
    rows = load_rows(get_dataset_attrs(["demo_alpaca"], data_dir)[0], data_dir)[: args.rows]
    raw = AutoTokenizer.from_pretrained(args.tokenizer)
    ours = AutoTokenizer.from_pretrained(args.tokenizer)
    template = get_template(args.template)
    fix_tokenizer(template, ours)

    def baseline(row):
        raw.apply_chat_template([*row["prompt"], *row["response"]], tokenize=True)

    def tuneline(row):
        encode_supervised_row(row, template=template, tokenizer=ours, cutoff_len=2048)

    base_rate = rows_per_second(baseline, rows)
    our_rate = rows_per_second(tuneline, rows)
    print(f"rows: {len(rows)}  tokenizer: {args.tokenizer}  template: {args.template}")
    print(f"raw apply_chat_template: {base_rate:10.1f} rows/s")
    print(f"tuneline supervised:     {our_rate:10.1f} rows/s")
    print(f"ratio (tuneline / raw):  {our_rate / base_rate:10.2f}")


if __name__ == "__main__":
    main()
