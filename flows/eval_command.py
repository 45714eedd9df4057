"""`tuneline eval CONFIG.yaml [key=value ...]`: LLaMA-Factory's multiple-choice benchmark evaluation
(MMLU, CMMLU, C-Eval; `llamafactory-cli eval`) of a model, with an adapter merged when one is named.

The config is LLaMA-Factory's eval YAML (`task`, `task_dir`, `lang`, `n_shot`, `save_dir`, `batch_size`,
`seed` beside the model, adapter and template keys). The scores are printed as LLaMA-Factory prints
them and, with `save_dir`, written there as results.json and results.log. Exit 2 for a bad config
or benchmark file, with one paragraph naming the key, file or row.
"""

from __future__ import annotations

import argparse
import sys


def add_eval_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("eval", help="score a model on a multiple-choice benchmark (MMLU, CMMLU, C-Eval) as "
                                                "llamafactory-cli eval does")
    evaluate.add_argument("config", help="eval YAML (LLaMA-Factory keys: task, task_dir, lang, n_shot, save_dir, ...)")
    evaluate.add_argument("overrides", nargs="*", metavar="key=value")
    evaluate.set_defaults(handler=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from tuneline.core.config.benchmark import load_eval_config
    from tuneline.core.evaluation.multiple_choice import run_benchmark

    config = load_eval_config(args.config, args.overrides)
    result = run_benchmark(config)
    print(result.score_text())
    if not result.answered:
        print(f"note: some {result.benchmark} {result.split} files hold no answers (C-Eval keeps its test answers "
              "private), so their questions count as wrong, as in LLaMA-Factory; results.json holds the predictions.",
              file=sys.stderr)
    if config.benchmark.save_dir:
        print(f"results written to {config.benchmark.save_dir}", file=sys.stderr)
    return 0
