"""Champion/challenger promotion (docs/ARCHITECTURE.md, "Tracking"): whether a newly registered version takes the champion
alias, decided on one metric or by a user function. Pure: no MLflow here (`core/registry.py` reads
and writes the registry through `core/tracking.py`).

The candidate's metrics are the exported stage's manifest metrics plus the `evaluate` section's
(`answer_f1`, `eval_loss`, ...; the exported stage's value wins on a shared name). Each registered
version keeps its metrics as `tuneline.metric.<name>` tags, so a champion is judged by the numbers
it was registered with, not by a recomputation.
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tuneline.core.errors import ConfigError, nearest

METRIC_TAG_PREFIX = "tuneline.metric."
CHALLENGER_ALIAS = "challenger"
_LOWER_IS_BETTER_WORDS = ("loss", "perplexity", "ppl", "kl")
_NOT_METRICS = ("stage_seconds",)
PromoteFunction = Callable[[dict[str, float], dict[str, float]], bool]


@dataclass(frozen=True)
class PromotionRule:
    """How a candidate is judged against the champion; `metric` and `function` both None: always promote."""

    metric: str | None = None
    greater_is_better: bool = True
    min_improvement: float = 0.0
    function: str | None = None  # "module:function", called as function(candidate, champion) -> bool


@dataclass(frozen=True)
class Decision:
    """The outcome for one candidate version; `message` is what the summary prints."""

    version: str
    promoted: bool
    alias: str
    message: str
    champion_version: str | None = None


def greater_is_better(metric: str) -> bool:
    """Inferred direction: names with loss, perplexity/ppl or kl as a word are better lower."""
    words = re.split(r"[^a-z0-9]+", metric.lower())
    return not any(w in _LOWER_IS_BETTER_WORDS or w.endswith("loss") for w in words)


def rule_from_settings(
    *, metric: str | None, greater: bool | None, min_improvement: float, function: str | None
) -> PromotionRule:
    direction = greater if greater is not None else (greater_is_better(metric) if metric else True)
    return PromotionRule(metric=metric, greater_is_better=direction, min_improvement=min_improvement, function=function)


def candidate_metrics(
    sources: Mapping[str, Mapping[str, object]],
) -> tuple[dict[str, float], dict[str, str]]:
    """Numeric metrics from each source (first source wins a shared name) and where each was read."""
    metrics: dict[str, float] = {}
    origin: dict[str, str] = {}
    for source, values in sources.items():
        for name, value in values.items():
            if name in metrics or name in _NOT_METRICS or not _is_finite_number(value):
                continue
            metrics[name] = float(value)  # type: ignore[arg-type]
            origin[name] = source
    return metrics, origin


def check_metric(rule: PromotionRule, metrics: Mapping[str, float], origin: Mapping[str, str]) -> None:
    """A `promote_metric` the candidate does not report is a configuration error, listing the ones it does."""
    if rule.metric is None or rule.metric in metrics:
        return
    guess = nearest(rule.metric, metrics)
    where = ", ".join(sorted(set(origin.values()))) or "no stage"
    raise ConfigError(
        f"'register.promote_metric: {rule.metric}' is not a metric of the candidate (read from {where}); "
        + (f"did you mean '{guess}'? " if guess else "")
        + f"set it to one of: {', '.join(sorted(metrics)) or '(none)'}."
    )


def metric_tags(metrics: Mapping[str, float]) -> dict[str, str]:
    return {f"{METRIC_TAG_PREFIX}{name}": repr(value) for name, value in metrics.items()}


def metrics_from_tags(tags: Mapping[str, str]) -> dict[str, float]:
    found = {}
    for key, value in tags.items():
        if key.startswith(METRIC_TAG_PREFIX):
            try:
                found[key[len(METRIC_TAG_PREFIX):]] = float(value)
            except ValueError:
                continue
    return found


def decide(
    rule: PromotionRule,
    *,
    version: str,
    candidate: Mapping[str, float],
    champion_version: str | None,
    champion: Mapping[str, float],
    alias: str = "champion",
    search_dir: str | Path | None = None,
) -> Decision:
    """Promote the candidate (`alias` moves to it) or make it challenger, with the reason in words."""
    def won(why: str) -> Decision:
        return Decision(version, True, alias, f"version {version} becomes {alias}: {why}", champion_version)

    def lost(why: str) -> Decision:
        return Decision(version, False, CHALLENGER_ALIAS, f"version {version} becomes {CHALLENGER_ALIAS}: {why}", champion_version)

    if rule.metric is None and rule.function is None:
        return won("no register.promote_metric or promote_function is set, so the alias always moves")
    if champion_version is None:
        return won(f"it is the first version (no @{alias} yet)")
    if champion_version == version:
        return Decision(version, True, alias, f"version {version} stays {alias} (the export is unchanged)", champion_version)
    if rule.function is not None:
        function = load_promote_function(rule.function, search_dir=search_dir)
        verdict = function(dict(candidate), dict(champion))
        if not isinstance(verdict, bool):
            raise ConfigError(f"'register.promote_function: {rule.function}' returned {verdict!r}; it must return True "
                              f"(promote) or False (keep the champion).")
        why = f"{rule.function} said {'yes' if verdict else 'no'} against {alias} version {champion_version}"
        return won(why) if verdict else lost(why)
    assert rule.metric is not None
    if rule.metric not in champion:
        return won(f"{alias} version {champion_version} has no recorded {rule.metric}")
    new, old = candidate[rule.metric], champion[rule.metric]
    gain = new - old if rule.greater_is_better else old - new
    direction = "higher" if rule.greater_is_better else "lower"
    threshold = f", needs {rule.min_improvement:g} better" if rule.min_improvement else ""
    why = (f"{rule.metric} {new:.4g} vs {alias} version {champion_version}'s {old:.4g} "
           f"({direction} is better{threshold})")
    return won(why) if gain > rule.min_improvement else lost(why)


def load_promote_function(spec: str, *, search_dir: str | Path | None = None) -> PromoteFunction:
    """Import `module:function`; the pipeline YAML's folder is searched first, then sys.path."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(f"'register.promote_function: {spec}' must be 'module:function', for example "
                          f"'my_rules:better_than_champion'.")
    added = str(Path(search_dir).resolve()) if search_dir is not None else None
    if added:
        sys.path.insert(0, added)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"'register.promote_function: {spec}': cannot import module '{module_name}' ({e}); put "
                          f"{module_name}.py beside the pipeline YAML or install it.") from e
    finally:
        if added and added in sys.path:
            sys.path.remove(added)
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"'register.promote_function: {spec}': module '{module_name}' has no function "
                          f"'{attribute}'; define def {attribute}(candidate: dict, champion: dict) -> bool.")
    return function


def settings_problems(*, metric: str | None, function: str | None, min_improvement: float) -> list[str]:
    """Problems in the `register` section's promotion keys that show before any work."""
    problems = []
    if metric is not None and not metric.strip():
        problems.append("'register.promote_metric' is empty; name a metric such as eval_loss, or remove the key.")
    if not math.isfinite(min_improvement):
        problems.append(f"'register.min_improvement' must be a finite number, got {min_improvement}.")
    if min_improvement and metric is None:
        problems.append("'register.min_improvement' needs 'register.promote_metric' (the metric it applies to).")
    if function is not None and metric is not None:
        problems.append("'register' sets both 'promote_metric' and 'promote_function'; keep one (the function "
                        "receives every metric of the candidate and the champion).")
    return problems


def push_history(history: list[str], version: str, *, limit: int = 100) -> list[str]:
    """Champion history (oldest first, current last) after `version` takes the alias."""
    if history and history[-1] == version:
        return history
    return [*history, version][-limit:]


def _is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
