"""tuneline as a worker machine has it: built as a wheel and installed in a fresh venv, no checkout.

The fresh venv borrows this venv's dependencies (torch, Prefect, MLflow, ...) instead of installing
them, which would take minutes and the network: a `.pth` file names this venv's site-packages. A
folder added by a `.pth` line is put on `sys.path` without reading that folder's own `.pth` files, so
the editable install's finder (`__editable__.tuneline-*.pth` there) stays off and `import tuneline`
finds the wheel's copy, which comes first on the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def build_wheel(folder: Path) -> Path:
    """`pip wheel .` of the checkout into `folder`; setuptools' build and egg-info folders go there too,
    so the checkout gets no build/ and no file left from an earlier build reaches the wheel."""
    folder.mkdir(parents=True, exist_ok=True)
    build_config = folder / "build.cfg"
    build_config.write_text(f"[build]\nbuild_base = {folder / 'build'}\n[egg_info]\negg_base = {folder}\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(folder),
               str(REPO_ROOT)]
    env = {**_environ(), "DIST_EXTRA_CONFIG": str(build_config)}  # read by setuptools' distutils
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = folder.glob("tuneline-*.whl")
    return wheel


def install_in_fresh_venv(wheel: Path, venv: Path) -> Path:
    """`wheel` installed alone in a new venv at `venv` that sees this venv's dependencies; its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    # this venv's pip, run by the new interpreter (`pip --python`): the wheel's scripts start the new venv's python
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                                "--quiet", str(wheel)], capture_output=True, text=True, timeout=300, env=_environ())
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site_packages = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # written after the install, so that pip saw an environment without tuneline in it
    borrowed = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site_packages / "borrowed_dependencies.pth").write_text("".join(f"{path}\n" for path in borrowed), encoding="utf-8")
    return site_packages


def wheel_files(wheel: Path) -> set[str]:
    return set(zipfile.ZipFile(wheel).namelist())


def tracked_files(*folders: str) -> list[str]:
    """The files git tracks under `folders` of the checkout, as paths relative to its root."""
    listed = subprocess.run(["git", "ls-files", "--", *folders], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return listed.stdout.splitlines()


def _environ() -> dict[str, str]:
    return {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
