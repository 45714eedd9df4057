"""Every command README.md shows runs as written, and its YAML files are ones tuneline reads.

The cheap commands run here: each `tuneline` line is parsed by the command's own parser exactly as
written, and its command's help runs in this process. The ones that train, serve or install are
listed in `RUN_ELSEWHERE` with where the suite runs them; a command in neither fails the test, so a
new line in README.md has to say which it is. The setup and test commands must be `.ci/run`'s.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, run_cli_here

README = REPO_ROOT / "README.md"
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.S | re.M)

RUN_ELSEWHERE = {
    "python -m venv": ".ci/run installs exactly this line, then runs the suite",
    "pytest": "the suite itself; .ci/run runs it",
    "tuneline demo": "trains the whole demo chain: tests/flows/test_demo.py",
    "tuneline train": "trains (its model from the Hub): tests/flows/test_single_stage.py, "
                      "tests/flows/test_llamafactory_examples.py",
    "tuneline run": "trains a pipeline: tests/flows/test_chain.py, tests/flows/test_demo.py",
    "tuneline api": "serves a model until stopped: tests/flows/test_api.py",
    "mlflow ui": "MLflow's own server, until stopped",
}
"""Commands that train, serve or install, by their first words, with where they run instead."""


def fenced(lang: str) -> list[str]:
    return [m["body"] for m in FENCE.finditer(README.read_text(encoding="utf-8")) if m["lang"] == lang]


def shown_commands() -> list[str]:
    """Each command line of README's bash blocks, its trailing comment removed."""
    lines = [line for block in fenced("bash") for line in block.splitlines() if line.strip()]
    return [shlex.join(shlex.split(line, comments=True)) for line in lines]


def tuneline_argv(command: str) -> list[str]:
    """The arguments of `tuneline ...` in `command` (the setup line ends with `&& tuneline demo`)."""
    words = shlex.split(command)
    start = len(words) - 1 - words[::-1].index("tuneline")
    return words[start + 1:]


def test_setup_and_test_commands_are_ci_s():
    ci_lines = [line for line in (REPO_ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
                if line and not line.startswith(("#", " "))]
    install = next(line for line in ci_lines if line.startswith("python -m venv"))
    setup, tests = fenced("bash")[:2]
    assert setup.strip() == f"{install} && tuneline demo"
    assert tests.strip() == "pytest" and "pytest" in ci_lines


def test_every_shown_command_runs_here_or_is_run_elsewhere():
    commands = shown_commands()
    assert len(commands) >= 8, commands
    unclassified = [c for c in commands if not c.startswith("tuneline") and not c.startswith(tuple(RUN_ELSEWHERE))]
    assert not unclassified, f"README.md shows commands this test neither runs nor places elsewhere: {unclassified}"


@pytest.mark.parametrize("command", [c for c in shown_commands() if "tuneline" in c.split()])
def test_tuneline_command_parses_as_written(command):
    from tuneline.flows.cli import build_parser

    argv = tuneline_argv(command)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"README.md's `{command}` is refused by tuneline's parser (exit {e.code})")
    assert args.command == argv[0]


def test_help_of_each_shown_command_runs(tmp_path):
    """Every command of README's command table, and `tuneline --help`, answer --help with exit 0."""
    table = re.findall(r"^\| `tuneline ([a-z]+(?: (?:preprocess|preview))?)", README.read_text(encoding="utf-8"), re.M)
    assert {"demo", "run", "train", "data preprocess", "api", "gc"} <= set(table), table
    top = run_cli_here("--help", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    for command in table:
        shown = run_cli_here(*command.split(), "--help", cwd=tmp_path)
        assert shown.returncode == 0 and shown.stdout.startswith(f"usage: tuneline {command}"), (command, shown.stderr)
        assert command.split()[0] in top.stdout


def test_yaml_files_are_read_by_tuneline(tmp_path):
    """The stage YAML is a checked stage config and the pipeline YAML a checked pipeline, on the demo's datasets."""
    from tuneline.core.pipeline.spec import TrainingStage, load_pipeline
    from tuneline.core.stages.registry import build_stage_config

    single, pipeline = (yaml.safe_load(block) for block in fenced("yaml"))
    registered = yaml.safe_load((REPO_ROOT / "data/dataset_info.json").read_text(encoding="utf-8"))

    config = build_stage_config(single, source="README.md")
    assert (config.finetuning.stage, config.finetuning.finetuning_type) == ("sft", "lora")
    assert set(single["dataset"].split(",")) <= set(registered) and single["dataset_dir"] == "data"

    path = tmp_path / "my_pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline), encoding="utf-8")
    spec = load_pipeline(path, workspace=tmp_path / "workspace")
    assert [stage.name for stage in spec.stages] == [stage["name"] for stage in pipeline["stages"]]
    trained = [stage for stage in spec.stages if isinstance(stage, TrainingStage)]
    assert {name for stage in trained for name in stage.config.data.dataset.split(",")} <= set(registered)
    assert spec.register is not None and spec.register.model_name == pipeline["register"]["model_name"]


def test_readme_is_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_links_into_the_docs_resolve():
    links = re.findall(r"\]\(((?:docs/)[^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    assert links
    assert not [link for link in links if not (REPO_ROOT / link).is_file()]


def test_run_elsewhere_names_files_that_exist():
    named = {path for reason in RUN_ELSEWHERE.values() for path in re.findall(r"tests/[\w/]+\.py", reason)}
    assert named and all((REPO_ROOT / path).is_file() for path in named), named
    assert Path(REPO_ROOT / ".ci/run").is_file()


def test_getting_started_shows_the_same_yaml_files():
    page = (REPO_ROOT / "docs/getting-started.md").read_text(encoding="utf-8")
    assert all(f"```yaml\n{block}```" in page for block in fenced("yaml"))
