"""What `tuneline demo` and `tuneline run` print when the flow has finished."""

from __future__ import annotations

from typing import Any

from tuneline.core.tracking.privacy import mask_password

NOTHING_CHANGED = "nothing changed since the last run: every stage served from cache, no training ran"
TRAINED_KIND = "trained"


def change_summary(stages: list[dict[str, Any]]) -> str:
    """One line on what this run had to redo: NOTHING_CHANGED, or the stages computed and whether
    any of them trained (a scheduled retrain on unchanged data says so in its log)."""
    computed = [stage["name"] for stage in stages if not stage["cache_hit"]]
    if not computed:
        return NOTHING_CHANGED
    trained = [stage["name"] for stage in stages if not stage["cache_hit"] and stage.get("kind") == TRAINED_KIND]
    training = f"training ran: {', '.join(trained)}" if trained else "no training ran"
    return f"changed since the last run: computed {', '.join(computed)}; {training}"


def print_summary(summary: dict[str, Any], *, seconds: float) -> None:
    print("\nstages:")
    for stage in summary["stages"]:
        status = "served from cache" if stage["cache_hit"] else "computed"
        timing = f"{stage['seconds']:6.1f} s" if "seconds" in stage else "        "
        print(f"  {stage['name']:<16} {status:<18} {timing}  {stage['path']}")
    evaluation = summary.get("evaluation") or {}
    if evaluation:
        print("\nevaluation:")
        for name, value in sorted(evaluation.items()):
            print(f"  {name:<28} {value:.4f}")
    computed = sum(1 for s in summary["stages"] if not s["cache_hit"])
    print(f"\n{computed} stage(s) computed, {len(summary['stages']) - computed} served from cache, in {seconds:.1f} s")
    print(summary.get("outcome") or change_summary(summary["stages"]))
    print(f"workspace:       {summary['workspace']}")
    print(f"MLflow:          {mask_password(summary['tracking_uri'])} (parent run {summary['parent_run_id']})")
    if "export_dir" in summary:
        print(f"exported model:  {summary['export_dir']}")
    registered = summary.get("registered")
    if registered:
        print(f"registered model: {registered['model_name']} version {registered['version']} alias @{registered['alias']}")
        source = f" [{registered['metric_source']}]" if registered.get("metric_source") else ""
        print(f"promotion:       {registered['decision']}{source}")
