"""Which stage keys a workspace's MLflow store still points at, for `tuneline gc`.

A key is referenced when a stage run of one of the last `keep_runs` pipeline runs of some
pipeline carries it (`tuneline.key`, computed or served from cache), or when a registered model
version's lineage names it (`tuneline.key.<stage>` and `tuneline.export_key`, see `lineage`).
Runs are counted per pipeline (MLflow experiment), so a workspace shared by two pipelines keeps
the recent cache of each; every status counts, so a killed run's resumable drafts are kept.
"""

from __future__ import annotations

from tuneline.core.tracking import runs as tracking

KEY_TAG = "tuneline.key"
PIPELINE_TAG = "tuneline.pipeline"
LINEAGE_KEY_PREFIX = "tuneline.key."
EXPORT_KEY_TAG = "tuneline.export_key"
TEMPLATE_WARNING_TAG = "tuneline.template_warning"
"""On a tokenize run whose named template renders differently from the tokenizer's own chat template."""
DEFAULT_KEEP_RUNS = 3


def referenced_keys(uri: str, *, keep_runs: int = DEFAULT_KEEP_RUNS) -> set[str]:
    return recent_run_keys(uri, keep_runs=keep_runs) | registered_keys(uri)


def recent_run_keys(uri: str, *, keep_runs: int) -> set[str]:
    """The keys of the stages of each pipeline's last `keep_runs` parent runs."""
    client = tracking.client(uri)
    keys: set[str] = set()
    if keep_runs <= 0:
        return keys
    for experiment in client.search_experiments():
        parents = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{PIPELINE_TAG}` LIKE '%'",
                                     order_by=["attributes.start_time DESC"], max_results=keep_runs)
        for parent in parents:
            children = client.search_runs([experiment.experiment_id],
                                          filter_string=f"tags.`{tracking.PARENT_TAG}` = '{parent.info.run_id}'")
            keys.update(child.data.tags[KEY_TAG] for child in children if KEY_TAG in child.data.tags)
    return keys


def registered_keys(uri: str) -> set[str]:
    """The stage keys every registered model version's lineage tags name."""
    client = tracking.client(uri)
    keys: set[str] = set()
    for model in client.search_registered_models(max_results=1000):
        for version in client.search_model_versions(f"name='{model.name}'"):
            keys.update(value for tag, value in version.tags.items()
                        if tag.startswith(LINEAGE_KEY_PREFIX) or tag == EXPORT_KEY_TAG)
    return keys
