"""`infer_backend`: which engine generates the served answers.

`huggingface` (transformers' generate) runs everywhere and is the one tuneline serves with.
`vllm` and `sglang` are LLaMA-Factory's GPU engines: asked for on a machine without their package
or without a CUDA GPU, they are refused with what is missing; where both are there, this version
still refuses them (it does not drive those engines yet) rather than serve with another engine
than the one named.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

BACKENDS = ("huggingface", "vllm", "sglang")
PACKAGES = {"vllm": "vllm", "sglang": "sglang"}


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def backend_problems(backend: str, *, has_package: Callable[[str], bool] | None = None,
                     has_cuda: Callable[[], bool] = _has_cuda) -> list[str]:
    """One line per reason `backend` cannot serve here (none for huggingface)."""
    if backend == "huggingface":
        return []
    found = has_package or (lambda name: importlib.util.find_spec(name) is not None)
    package = PACKAGES[backend]
    problems = []
    if not found(package):
        problems.append(f"'infer_backend: {backend}' needs the {package} package, which is not installed; install it "
                        f"(pip install {package}) on a CUDA machine, or use 'infer_backend: huggingface'.")
    if not has_cuda():
        problems.append(f"'infer_backend: {backend}' needs a CUDA GPU, and this machine has none; use "
                        "'infer_backend: huggingface', which runs on a CPU.")
    if not problems:
        problems.append(f"'infer_backend: {backend}' is not driven by this version of tuneline's server yet; use "
                        "'infer_backend: huggingface' (transformers' generate, on this GPU).")
    return problems
