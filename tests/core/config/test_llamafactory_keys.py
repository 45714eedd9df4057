"""Every argument name of LLaMA-Factory 0.9.5 (tests/data/llamafactory_arguments.json, read from its
dataclasses) is known: a stage config accepts it, or refuses it by name with the reason when it asks
for something that cannot run here. None is an unknown key."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tuneline.core.config import GROUPS, read_stage_config
from tuneline.core.config.llamafactory import BROKEN_UPSTREAM, NEEDS_CUDA, PENDING, REFUSED_KEYS

ARGUMENTS = json.loads((Path(__file__).resolve().parents[2] / "data/llamafactory_arguments.json").read_text())
FIELDS = {f for group in GROUPS.values() for f in group.__dataclass_fields__}
# a value each key can take, away from LLaMA-Factory's default, where the default alone would not do
PROBES: dict[str, Any] = {"stage": "dpo", "finetuning_type": "freeze", "infer_backend": "vllm", "reward_model_type": "full",
                          "mixture_of_depths": "convert", "rope_scaling": "linear", "quantization_device_map": "auto"}


def probe(name: str, spec: dict[str, Any]) -> Any:
    """A value of `name`'s type that differs from its default."""
    if name in PROBES:
        return PROBES[name]
    default, kind = spec["default"], spec["type"]
    choices = re.findall(r"'([^']+)'", kind) if "Literal" in kind else []
    if choices:
        return next(c for c in choices if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 2
    if "dict" in kind:
        return {"seed": 1}
    if "int" in kind:
        return 4
    if "float" in kind:
        return 0.5
    return "x"


REFUSALS = ("which tuneline does not offer", "available only on a CUDA GPU", "reads but does not implement yet",
            "which cannot run with this version of transformers")


def outcome(name: str, value: Any) -> tuple[str, list[str]]:
    """'unknown', 'refused' (a refusal that names the key and the reason) or 'accepted' (read, and
    its value checked: a value out of range is the key at work, not a refusal)."""
    _, problems = read_stage_config({name: value})
    mine = [p for p in problems if f"'{name}" in p]
    if any("unknown key" in p for p in mine):
        return "unknown", mine
    refusals = [p for p in mine if any(reason in p for reason in REFUSALS)]
    return ("refused" if refusals else "accepted"), refusals


def test_the_arguments_file_is_llamafactorys_229_names():
    assert ARGUMENTS["llamafactory_version"] == "0.9.5" and ARGUMENTS["count"] == len(ARGUMENTS["arguments"]) == 229


@pytest.mark.parametrize("name", sorted(ARGUMENTS["arguments"]))
def test_each_name_at_its_default_is_read_without_a_problem_of_its_own(name: str):
    kind, problems = outcome(name, ARGUMENTS["arguments"][name]["default"])
    assert kind == "accepted", problems


def test_every_name_is_accepted_or_refused_with_the_reason():
    results = {name: outcome(name, probe(name, spec)) for name, spec in ARGUMENTS["arguments"].items()}
    counts = Counter(kind for kind, _ in results.values())
    refused = {name: problems for name, (kind, problems) in results.items() if kind == "refused"}
    by_reason = Counter("refused by tuneline" if name in REFUSED_KEYS
                        else "needs CUDA" if any(name in t.keys or name in t.values for t in NEEDS_CUDA)
                        else "broken upstream" if any(name in t.keys for t, _ in BROKEN_UPSTREAM)
                        else "not implemented yet" for name in refused)
    print(f"accepted {counts['accepted']}, refused {counts['refused']}, unknown {counts['unknown']}")
    print("refused: " + ", ".join(f"{reason} {n}" for reason, n in sorted(by_reason.items())))
    for name, problems in sorted(refused.items()):
        print(f"  {name}: {problems[0][:140]}")
    assert counts["unknown"] == 0, [name for name, (kind, _) in results.items() if kind == "unknown"]
    for name, problems in refused.items():
        assert len(problems) == 1 and problems[0].rstrip().endswith(".") and len(problems[0]) > 60, (name, problems)
    pending = {key for table in PENDING for key in (*table.keys, *table.values)}
    pending |= {key for table, _ in BROKEN_UPSTREAM for key in table.keys}
    # exactly those: a CUDA-only key is refused here for the missing GPU, on a CUDA machine as not yet implemented
    assert set(refused) == (set(REFUSED_KEYS) | pending) & set(ARGUMENTS["arguments"])
    assert set(ARGUMENTS["arguments"]) <= FIELDS | set(REFUSED_KEYS)


def test_mixture_of_depths_is_accepted_with_full_training():
    assert outcome("mixture_of_depths", "load") == ("accepted", [])
    _, problems = read_stage_config({"mixture_of_depths": "convert", "finetuning_type": "full"})
    assert problems == []


def test_every_default_is_llamafactorys():
    """A key left out means what it means in LLaMA-Factory 0.9.5; `stage` alone reads None, which the
    registry turns into its default kind (sft, LLaMA-Factory's default too)."""
    import dataclasses

    from tuneline.core.stages.registry import DEFAULT_STAGE

    ours = {f.name: f.default for group in GROUPS.values() for f in dataclasses.fields(group)}
    differing = {name: (ours[name], spec["default"]) for name, spec in ARGUMENTS["arguments"].items()
                 if name in ours and ours[name] != spec["default"]}
    assert differing == {"stage": (None, "sft")} and DEFAULT_STAGE == "sft"
