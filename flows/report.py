"""What `tuneline demo` and `tuneline run` print when the flow has finished."""

from __future__ import annotations

from typing import Any


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
    print(f"workspace:       {summary['workspace']}")
    print(f"MLflow:          {summary['tracking_uri']} (parent run {summary['parent_run_id']})")
    if "export_dir" in summary:
        print(f"exported model:  {summary['export_dir']}")
    registered = summary.get("registered")
    if registered:
        print(f"registered model: {registered['model_name']} version {registered['version']} alias @{registered['alias']}")
