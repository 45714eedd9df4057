"""The line a pipeline run ends with: what it had to redo, and whether anything trained."""

from __future__ import annotations

from tuneline.flows.report import NOTHING_CHANGED, change_summary


def stage(name: str, kind: str, cache_hit: bool) -> dict:
    return {"name": name, "kind": kind, "cache_hit": cache_hit, "path": f"/ws/{name}"}


def test_a_run_served_wholly_from_cache_says_nothing_changed():
    stages = [stage("base", "base", True), stage("sft/tokenize", "tokenized", True), stage("sft", "trained", True),
              {"name": "register", "key": "export-1", "cache_hit": True, "path": "models:/m@champion"}]
    assert change_summary(stages) == NOTHING_CHANGED == (
        "nothing changed since the last run: every stage served from cache, no training ran")


def test_a_run_that_recomputed_names_the_stages_and_the_training():
    stages = [stage("sft/tokenize", "tokenized", True), stage("sft", "trained", False), stage("sft/merge", "merged", False)]
    assert change_summary(stages) == "changed since the last run: computed sft, sft/merge; training ran: sft"
    only_eval = [stage("sft", "trained", True), stage("sft/evaluate", "evaluation", False)]
    assert change_summary(only_eval) == "changed since the last run: computed sft/evaluate; no training ran"
