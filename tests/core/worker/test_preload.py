"""The worker started ahead of its job, and which jobs keep bitsandbytes out of their process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import missing_asset
from tuneline.core.training.optimizers.rules import OPTIMIZER_PACKAGES
from tuneline.core.worker.launch import worker_started_ahead
from tuneline.core.worker.preload import needs_bitsandbytes, requires_bitsandbytes


def folder_with_config(path: Path, **config) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return str(path)


def test_only_jobs_that_may_call_bitsandbytes_keep_it(tmp_path):
    plain = folder_with_config(tmp_path / "plain")
    quantized = folder_with_config(tmp_path / "quantized", quantization_config={"quant_method": "bitsandbytes"})
    assert not needs_bitsandbytes(model={}, training={}, finetuning={}, optimizer={}, model_paths=[plain, None])
    assert not needs_bitsandbytes(model={"quantization_bit": None}, training={"optim": "adamw_torch"}, finetuning={}, optimizer={},
                                  model_paths=[plain])
    assert needs_bitsandbytes(model={"quantization_bit": 4}, training={}, finetuning={}, optimizer={}, model_paths=[plain])
    for optim in ("adamw_8bit", "paged_adamw_32bit", "lion_32bit", "adamw_bnb_8bit", "galore_adamw", "apollo_adamw_layerwise"):
        assert needs_bitsandbytes(model={}, training={"optim": optim}, finetuning={}, optimizer={}, model_paths=[plain]), optim
    # a pre-quantized reference
    assert needs_bitsandbytes(model={}, training={}, finetuning={}, optimizer={}, model_paths=[plain, quantized])
    assert needs_bitsandbytes(model={}, training={}, finetuning={}, optimizer={}, model_paths=["org/model-on-the-hub"])  # unknown: allowed
    for key in ("ref_model_quantization_bit", "reward_model_quantization_bit"):  # a reference loaded in 4 bits
        assert needs_bitsandbytes(model={}, training={}, finetuning={key: 4}, optimizer={}, model_paths=[plain])


def test_an_optimizer_key_whose_package_imports_bitsandbytes_keeps_it(tmp_path):
    plain = folder_with_config(tmp_path / "plain")
    chosen = {key: needs_bitsandbytes(model={}, training={}, finetuning={}, optimizer={key: True}, model_paths=[plain])
              for key in (*OPTIMIZER_PACKAGES, "use_muon")}
    # galore-torch and apollo-torch require bitsandbytes (their 8-bit optimizers); badam, adam-mini and torch's Muon do not
    assert chosen == {"use_galore": True, "use_apollo": True, "use_badam": False, "use_adam_mini": False, "use_muon": False}
    assert not requires_bitsandbytes("a-package-that-is-not-installed")


@pytest.mark.slow
def test_keeping_bitsandbytes_out_breaks_no_optimizer_package_a_job_imports():
    """Each optimizer package imported as the worker would: with bitsandbytes kept out, unless the
    package requires it. The ones judged not to need it import with it kept out (so no job pays for
    bitsandbytes it does not use); the ones judged to need it fail with it kept out, and import once
    it is allowed."""
    probe = """
import importlib, json, sys
from tuneline.core.training.optimizers.rules import OPTIMIZER_PACKAGES
from tuneline.core.worker.preload import BITSANDBYTES, keep_out_bitsandbytes, requires_bitsandbytes

def imports(package):
    try:
        importlib.import_module(package)
        return "imports"
    except ImportError:
        return "fails"

keep_out_bitsandbytes()
seen = {package: [imports(package) + " kept out"] for package in OPTIMIZER_PACKAGES.values()}
del sys.modules[BITSANDBYTES]
for package in filter(requires_bitsandbytes, OPTIMIZER_PACKAGES.values()):
    seen[package].append(imports(package) + " allowed")
print(json.dumps(seen))
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen == {"badam": ["imports kept out"], "adam_mini": ["imports kept out"],
                    "galore_torch": ["fails kept out", "imports allowed"],
                    "apollo_torch": ["fails kept out", "imports allowed"]}, seen


def test_kept_out_bitsandbytes_reads_as_not_installed():
    probe = ("from tuneline.core.worker.preload import keep_out_bitsandbytes; keep_out_bitsandbytes(); "
             "import importlib.util, sys; print(importlib.util.find_spec('bitsandbytes') is None, "
             "sys.modules['bitsandbytes'] is None)")
    if importlib.util.find_spec("bitsandbytes") is None:
        missing_asset("bitsandbytes, a dependency of tuneline, is not installed here")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["True", "True"]


def test_a_worker_whose_job_never_comes_is_ended():
    with worker_started_ahead("sft", without_bitsandbytes=True, env={}) as worker:
        assert worker is not None and worker.poll() is None
    assert worker.returncode is not None  # ended on leaving, not left importing in the background


def test_torchrun_launches_start_no_worker_ahead():
    with worker_started_ahead("sft", without_bitsandbytes=True, env={"FORCE_TORCHRUN": "1"}) as worker:
        assert worker is None


def test_an_adapter_folder_is_judged_by_its_base_model(tmp_path):
    plain = folder_with_config(tmp_path / "plain")
    quantized = folder_with_config(tmp_path / "quantized", quantization_config={"quant_method": "bitsandbytes"})
    for name, base in (("on_plain", plain), ("on_quantized", quantized), ("on_hub", "org/model-on-the-hub")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    judge = lambda name: needs_bitsandbytes(model={}, training={}, finetuning={}, optimizer={}, model_paths=[plain, str(tmp_path / name)])  # noqa: E731
    assert not judge("on_plain")  # a LoRA reward model trained on a plain base
    assert judge("on_quantized") and judge("on_hub")
