"""Promotion decisions, the `register` section's promotion keys, and lineage (no training, no MLflow)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.spec import build_pipeline
from tuneline.core.tracking.lineage import git_commit, lineage_tags
from tuneline.core.tracking.promotion import (
    PromotionRule,
    candidate_metrics,
    check_metric,
    decide,
    greater_is_better,
    metric_tags,
    metrics_from_tags,
    push_history,
    rule_from_settings,
)


def test_direction_is_inferred_from_the_metric_name():
    for lower in ("eval_loss", "train_loss", "eval_perplexity", "eval_ppo_kl", "ppl"):
        assert not greater_is_better(lower), lower
    for higher in ("answer_f1", "eval_rm_accuracy", "eval_pref_reward_accuracy", "eval_ppo_reward", "skill"):
        assert greater_is_better(higher), higher
    assert rule_from_settings(metric="eval_loss", greater=True, min_improvement=0, function=None).greater_is_better


def test_metric_rule_promotes_only_a_candidate_that_beats_the_threshold():
    rule = rule_from_settings(metric="eval_loss", greater=None, min_improvement=0.05, function=None)
    win = decide(rule, version="3", candidate={"eval_loss": 1.0}, champion_version="2", champion={"eval_loss": 1.1})
    lose = decide(rule, version="3", candidate={"eval_loss": 1.07}, champion_version="2", champion={"eval_loss": 1.1})
    assert (win.promoted, win.alias) == (True, "champion")
    assert (lose.promoted, lose.alias) == (False, "challenger")
    assert lose.message == ("version 3 becomes challenger: eval_loss 1.07 vs champion version 2's 1.1 "
                            "(lower is better, needs 0.05 better)")
    tie = decide(PromotionRule(metric="answer_f1"), version="3", candidate={"answer_f1": 0.5}, champion_version="2",
                 champion={"answer_f1": 0.5})
    assert not tie.promoted  # the candidate must beat the champion, not equal it


def test_first_version_unset_rule_and_unchanged_export_take_the_alias():
    rule = PromotionRule(metric="answer_f1")
    assert decide(rule, version="1", candidate={"answer_f1": 0.1}, champion_version=None, champion={}).promoted
    assert "first version" in decide(rule, version="1", candidate={}, champion_version=None, champion={}).message
    same = decide(rule, version="2", candidate={"answer_f1": 0.1}, champion_version="2", champion={"answer_f1": 0.1})
    assert same.promoted and "stays champion" in same.message
    always = decide(PromotionRule(), version="5", candidate={}, champion_version="4", champion={"answer_f1": 9.0})
    assert always.promoted and "always moves" in always.message
    unrecorded = decide(rule, version="5", candidate={"answer_f1": 0.1}, champion_version="4", champion={})
    assert unrecorded.promoted and "has no recorded answer_f1" in unrecorded.message


def test_promote_function_decides_and_must_return_a_bool(tmp_path):
    (tmp_path / "my_rules.py").write_text(
        "def both(candidate, champion):\n"
        "    return candidate['answer_f1'] > champion['answer_f1'] and candidate['eval_loss'] < champion['eval_loss']\n"
        "def vague(candidate, champion):\n    return 1\n")
    rule = PromotionRule(function="my_rules:both")
    champion = {"answer_f1": 0.5, "eval_loss": 2.0}
    yes = decide(rule, version="2", candidate={"answer_f1": 0.6, "eval_loss": 1.9}, champion_version="1",
                 champion=champion, search_dir=tmp_path)
    no = decide(rule, version="2", candidate={"answer_f1": 0.6, "eval_loss": 2.1}, champion_version="1",
                champion=champion, search_dir=tmp_path)
    assert yes.promoted and not no.promoted and "my_rules:both said no" in no.message
    with pytest.raises(ConfigError, match="returned 1; it must return True"):
        decide(PromotionRule(function="my_rules:vague"), version="2", candidate={}, champion_version="1", champion={},
               search_dir=tmp_path)


def test_unknown_metric_names_the_key_and_the_metrics_there_are():
    metrics, origin = candidate_metrics({"stage 'sft' manifest": {"eval_loss": 1.5, "stage_seconds": 3.0, "flag": True},
                                         "evaluate": {"answer_f1": 0.2, "eval_loss": 9.0}})
    assert metrics == {"eval_loss": 1.5, "answer_f1": 0.2}  # the exported stage's value wins a shared name
    assert origin == {"eval_loss": "stage 'sft' manifest", "answer_f1": "evaluate"}
    with pytest.raises(ConfigError, match=r"'register.promote_metric: eval_los'.*did you mean 'eval_loss'.*answer_f1, eval_loss"):
        check_metric(PromotionRule(metric="eval_los"), metrics, origin)


def test_metrics_round_trip_through_version_tags():
    tags = metric_tags({"eval_loss": 1.2345678901, "answer_f1": 0.5})
    assert tags["tuneline.metric.eval_loss"] == "1.2345678901"
    assert metrics_from_tags({**tags, "tuneline.key.sft": "x"}) == {"eval_loss": 1.2345678901, "answer_f1": 0.5}


def test_champion_history_appends_new_holders_only():
    assert push_history([], "1") == ["1"]
    assert push_history(["1", "2"], "2") == ["1", "2"]
    assert push_history(["1", "2"], "1") == ["1", "2", "1"]
    assert push_history([str(i) for i in range(100)], "x")[-1] == "x"


def _raw(**register):
    return {"name": "p", "stages": [{"name": "a", "stage": "sft", "model_name_or_path": "m"}],
            "export": {"stage": "a"}, "register": {"model_name": "m", **register}}


def test_register_section_reads_the_promotion_keys(tmp_path):
    (tmp_path / "rules.py").write_text("def better(candidate, champion):\n    return True\n")
    pipeline = build_pipeline(_raw(promote_metric="eval_loss", min_improvement="0.01", greater_is_better="false"), overrides={})
    assert (pipeline.register.promote_metric, pipeline.register.min_improvement) == ("eval_loss", 0.01)
    assert pipeline.register.greater_is_better is False
    function = build_pipeline(_raw(promote_function="rules:better"), overrides={}, source=str(tmp_path / "p.yaml"))
    assert function.register.promote_function == "rules:better"


def test_bad_promotion_keys_are_all_reported(tmp_path):
    with pytest.raises(ConfigError) as caught:
        build_pipeline(_raw(promote_metrc="eval_loss"), overrides={})
    assert "'register': unknown key 'promote_metrc'; did you mean 'promote_metric'?" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        build_pipeline(_raw(min_improvement=0.1, alias="challenger"), overrides={})
    assert "'register.min_improvement' needs 'register.promote_metric'" in str(caught.value)
    assert "'register.alias: challenger'" in str(caught.value)
    with pytest.raises(ConfigError, match="must be 'module:function'"):
        build_pipeline(_raw(promote_function="rules.better"), overrides={}, source=str(tmp_path / "p.yaml"))
    with pytest.raises(ConfigError, match="cannot import module 'no_such_rules'"):
        build_pipeline(_raw(promote_function="no_such_rules:better"), overrides={}, source=str(tmp_path / "p.yaml"))
    with pytest.raises(ConfigError, match="keep one"):
        build_pipeline(_raw(promote_metric="eval_loss", promote_function="x:y"), overrides={})


def test_git_commit_is_absent_outside_a_checkout_or_without_git(tmp_path, monkeypatch):
    assert git_commit(tmp_path) is None
    assert "tuneline.git_commit" not in lineage_tags([("sft", "k")], {"d": "f" * 64}, pipeline_source=str(tmp_path / "p.yaml"))
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
                       cwd=tmp_path, check=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
        tags = lineage_tags([("sft", "k")], {"d": "f" * 64}, pipeline_source=str(tmp_path / "p.yaml"))
        assert tags["tuneline.git_commit"] == head
        assert tags["tuneline.key.sft"] == "k" and tags["tuneline.data.d"] == "f" * 16
    monkeypatch.setenv("PATH", "")
    assert git_commit(tmp_path) is None
