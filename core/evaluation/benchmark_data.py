"""A multiple-choice benchmark in LLaMA-Factory's `evaluation/` layout (MMLU, CMMLU, C-Eval), every row checked.

    {task_dir}/{benchmark}/mapping.json   {subject: {"name": ..., "category": STEM | Social Sciences | Humanities | Other}}
    MMLU    data/{dev,val,test}/{subject}_{dev|val|test}.csv   no header: question,A,B,C,D,answer
    CMMLU   {dev,test}/{subject}.csv                            header ,Question,A,B,C,D,Answer (an index first)
    C-Eval  {dev,val,test}/{subject}_{dev|val|test}.csv         header id,question,A,B,C,D,answer,explanation

The CSVs are read from the extracted folders, or straight from `{benchmark}.zip` beside mapping.json
(as LLaMA-Factory's repository ships them); an extracted file wins over the zip's. LLaMA-Factory's
dataset scripts name the splits train (the dev files: the n-shot examples), validation (val) and test,
and `task` is `<benchmark>_<split>`. A header layout may lack the answer column, as C-Eval's test files
do (its answers are private): those questions have the answer "".

Cells are kept as the text they hold. LLaMA-Factory reads them through pandas, which turns a column of
numbers into numbers (a column holding "2" and "2.5" gives "2.0") and cells such as "", "NA" or "None"
into NaN; tuneline shows the model the text of the file.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tuneline.core.errors import ConfigError, listed, nearest

CHOICES = ("A", "B", "C", "D")
CATEGORIES = ("STEM", "Social Sciences", "Humanities", "Other")
SPLITS = ("train", "validation", "test")
EXAMPLE_SPLIT = "train"
MAPPING = "mapping.json"
MAX_LISTED = 20  # problems listed at once; the rest are counted


@dataclass(frozen=True)
class Layout:
    """Where a benchmark's CSVs lie and how their columns read."""

    folders: Mapping[str, str]  # split -> folder of its files
    path: str  # a subject's file in a folder, formatted with `folder` and `subject`
    header: tuple[str, ...] | None  # header names of question, A, B, C, D, answer; None: no header, those six columns


LAYOUTS: dict[str, Layout] = {
    "mmlu": Layout({"train": "dev", "validation": "val", "test": "test"}, "data/{folder}/{subject}_{folder}.csv", None),
    "cmmlu": Layout({"train": "dev", "test": "test"}, "{folder}/{subject}.csv", ("Question", "A", "B", "C", "D", "Answer")),
    "ceval": Layout({"train": "dev", "validation": "val", "test": "test"}, "{folder}/{subject}_{folder}.csv",
                    ("question", "A", "B", "C", "D", "answer")),
}


@dataclass(frozen=True)
class Question:
    text: str
    choices: tuple[str, ...]  # the texts of A, B, C and D
    answer: str  # A, B, C or D; "" where the file has no answer column


@dataclass(frozen=True)
class Subject:
    key: str  # the file name's subject, mapping.json's key
    name: str  # as the prompt names it
    category: str
    questions: tuple[Question, ...]  # of the evaluated split
    examples: tuple[Question, ...]  # of the train (dev) split, the n-shot examples; empty when not read
    answered: bool  # whether the evaluated split's file holds answers


@dataclass(frozen=True)
class Benchmark:
    name: str  # mmlu, cmmlu or ceval
    split: str  # train, validation or test
    subjects: tuple[Subject, ...]  # in mapping.json's order


def parse_task(task: str) -> tuple[str, str]:
    """(benchmark, split) of `task: <benchmark>_<split>`, or a ConfigError saying what is wrong."""
    name, sep, split = task.rpartition("_")
    if not sep or not name or split not in SPLITS:
        raise ConfigError(f"'task: {task}' is not of the form <benchmark>_<split>, such as mmlu_test, cmmlu_test or "
                          f"ceval_validation (split: {listed(SPLITS)}).")
    if name not in LAYOUTS:
        guess = nearest(name, LAYOUTS)
        hint = f" (did you mean '{guess}_{split}'?)" if guess else ""
        raise ConfigError(f"'task: {task}' names the benchmark '{name}'{hint}, whose layout tuneline does not know; it "
                          f"reads LLaMA-Factory's {listed(sorted(LAYOUTS), last='and')} benchmark folders.")
    folders = LAYOUTS[name].folders
    if split not in folders:
        evaluated = listed([f"{name}_{s}" for s in folders if s != EXAMPLE_SPLIT])
        raise ConfigError(f"'task: {task}': {name} has no {split} split (its folders are "
                          f"{listed(folders.values(), last='and')}: the splits {listed(folders, last='and')}); use {evaluated}.")
    return name, split


def read_benchmark(*, task_dir: str | Path, task: str, with_examples: bool = True) -> Benchmark:
    """Every subject of mapping.json with its questions of the task's split and, `with_examples`,
    its dev split's; one ConfigError listing each file, row or entry that cannot be read."""
    name, split = parse_task(task)
    root = _benchmark_folder(Path(task_dir), name, task)
    mapping = read_mapping(root / MAPPING)
    layout = LAYOUTS[name]
    splits = (split, EXAMPLE_SPLIT) if with_examples and split != EXAMPLE_SPLIT else (split,)
    problems: list[str] = []
    with _opened(root, name) as files:
        for wanted in splits:
            _check_folder(files, layout, wanted, task=task)
        subjects = tuple(_read_subject(files, layout, key, entry, split=split, with_examples=with_examples,
                                       problems=problems) for key, entry in mapping.items())
    if problems:
        more = [f"... and {len(problems) - MAX_LISTED} more."] if len(problems) > MAX_LISTED else []
        raise ConfigError(problems[:MAX_LISTED] + more, source=f"'task: {task}'")
    return Benchmark(name=name, split=split, subjects=subjects)


def _benchmark_folder(task_dir: Path, name: str, task: str) -> Path:
    root = task_dir / name
    if root.is_dir():
        return root
    if not task_dir.is_dir():
        raise ConfigError(f"'task_dir: {task_dir}' is not a folder; point it at the folder that holds LLaMA-Factory's "
                          "benchmark folders (mmlu/, cmmlu/, ceval/: its repository's evaluation/).")
    present = sorted(p.name for p in task_dir.iterdir() if p.is_dir())
    holds = f"holds {listed(present, last='and')}" if present else "holds no folders"
    raise ConfigError(f"'task: {task}' reads the folder {root}, which does not exist ('task_dir: {task_dir}' {holds}); "
                      f"put LLaMA-Factory's {name}/ folder there or point task_dir at the folder that holds it.")


def read_mapping(path: Path) -> dict[str, tuple[str, str]]:
    """mapping.json as {subject: (name, category)}, every entry checked."""
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; a benchmark folder holds LLaMA-Factory's mapping.json "
                          "({subject: {\"name\": ..., \"category\": ...}}) beside its CSVs.")
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}.") from e
    if not isinstance(loaded, dict) or not loaded:
        raise ConfigError(f"{path} must map each subject to {{\"name\": ..., \"category\": ...}}; it holds no subjects.")
    mapping, problems = {}, []
    for subject, entry in loaded.items():
        name = entry.get("name") if isinstance(entry, dict) else None
        category = entry.get("category") if isinstance(entry, dict) else None
        if not isinstance(name, str) or category not in CATEGORIES:
            problems.append(f"{path}: subject '{subject}' must be {{\"name\": <text>, \"category\": one of "
                            f"{listed(CATEGORIES)}}}, got {entry!r}.")
        else:
            mapping[subject] = (name, category)
    if problems:
        raise ConfigError(problems)
    return mapping


@dataclass(frozen=True)
class _Files:
    """A benchmark folder's files: extracted ones first, else members of its zip."""

    root: Path
    archive: zipfile.ZipFile | None
    members: Mapping[str, str]  # path as the layout names it -> the zip member holding it

    def where(self, relative: str) -> str | None:
        """The file or zip member holding `relative`, as messages name it; None when there is none."""
        if (self.root / relative).is_file():
            return str(self.root / relative)
        if relative in self.members:
            return f"{self.archive.filename} ({self.members[relative]})"
        return None

    def open(self, relative: str) -> TextIO:
        if (self.root / relative).is_file():
            return (self.root / relative).open(encoding="utf-8-sig", newline="")
        return io.TextIOWrapper(self.archive.open(self.members[relative]), encoding="utf-8-sig", newline="")

    def folders(self) -> set[str]:
        extracted = {p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_dir()}
        return extracted | {part for path in self.members for part in _parents(path)}


def _parents(path: str) -> Iterator[str]:
    parts = path.split("/")[:-1]
    return ("/".join(parts[:i]) for i in range(1, len(parts) + 1))


@contextmanager
def _opened(root: Path, name: str) -> Iterator[_Files]:
    zip_path = root / f"{name}.zip"
    if not zip_path.is_file():
        yield _Files(root, None, {})
        return
    try:
        archive = zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile as e:
        raise ConfigError(f"{zip_path} is not a readable zip file ({e}); download it again or extract it there.") from e
    with archive:
        yield _Files(root, archive, _zip_members(archive))


def _zip_members(archive: zipfile.ZipFile) -> dict[str, str]:
    """Each file member by its path, and by its path inside a single top folder when the zip wraps one."""
    files = [name for name in archive.namelist() if not name.endswith("/")]
    members = {name: name for name in files}
    for name in files:
        if "/" in name:
            members.setdefault(name.split("/", 1)[1], name)
    return members


def _check_folder(files: _Files, layout: Layout, split: str, *, task: str) -> None:
    """Refuse a split whose folder is neither extracted nor in the zip."""
    folder = posixpath.dirname(layout.path.format(folder=layout.folders[split], subject="subject"))
    present = files.folders()
    if folder in present:
        return
    found = sorted(p for p in present if p.count("/") == folder.count("/"))
    where = f"{files.root}" + (f" or {files.archive.filename}" if files.archive else "")
    raise ConfigError(f"'task: {task}' needs the {split} split, whose files are in {folder}/, and {where} has no such folder "
                      f"({listed(found, last='and') or 'none'} there); extract the benchmark's zip there, or choose a "
                      "split it has.")


def _read_subject(files: _Files, layout: Layout, key: str, entry: tuple[str, str], *, split: str, with_examples: bool,
                  problems: list[str]) -> Subject:
    questions, answered = _read_split(files, layout, key, split, problems)
    examples: list[Question] = []
    if with_examples:
        examples, has_answers = _read_split(files, layout, key, EXAMPLE_SPLIT, problems)
        if not has_answers:
            problems.append(f"the {layout.folders[EXAMPLE_SPLIT]} file of '{key}' has no answer column; the n-shot "
                            "examples need their answers (or set 'n_shot: 0').")
    name, category = entry
    return Subject(key=key, name=name, category=category, questions=tuple(questions), examples=tuple(examples),
                   answered=answered)


def _read_split(files: _Files, layout: Layout, subject: str, split: str, problems: list[str]) -> tuple[list[Question], bool]:
    folder = layout.folders[split]
    relative = layout.path.format(folder=folder, subject=subject)
    where = files.where(relative)
    if where is None:
        zipped = f" or in {files.archive.filename}" if files.archive else ""
        problems.append(f"{files.root / MAPPING} names the subject '{subject}', but there is no {relative} in "
                        f"{files.root}{zipped}; add its files or remove the subject from mapping.json.")
        return [], True
    try:
        with files.open(relative) as handle:
            return _read_rows(handle, where=where, header=layout.header)
    except _RowError as e:
        problems.append(str(e))
    except UnicodeDecodeError as e:
        problems.append(f"{where} is not UTF-8 text ({e}); save it as UTF-8.")
    return [], True


class _RowError(Exception):
    """A row (or the header) of one file that cannot be read; its message names the file and line."""


def _read_rows(handle: TextIO, *, where: str, header: tuple[str, ...] | None) -> tuple[list[Question], bool]:
    """The file's questions and whether it holds answers."""
    reader = csv.reader(handle)
    columns, width = _columns(reader, where=where, header=header)
    questions = []
    start = reader.line_num + 1
    try:
        for row in reader:
            if row:  # a blank line, which pandas skips too
                questions.append(_question(row, columns, width=width, at=f"{where}, line {start}"))
            start = reader.line_num + 1
    except csv.Error as e:
        raise _RowError(f"{where}, line {start}: not readable as CSV ({e}).") from e
    return questions, columns[5] is not None


def _columns(reader, *, where: str, header: tuple[str, ...] | None) -> tuple[list[int | None], int]:
    """The indices of question, A-D and answer (None: no answer column), and the row width."""
    if header is None:
        return list(range(6)), 6
    try:
        names = next(reader, None)
    except csv.Error as e:
        raise _RowError(f"{where}, line 1: not readable as CSV ({e}).") from e
    if not names:
        raise _RowError(f"{where} is empty; it needs the header row {','.join(header)} and a row per question.")
    missing = [name for name in header[:5] if name not in names]
    if missing:
        raise _RowError(f"{where}, line 1: the header {','.join(names)} lacks {listed(missing, last='and')}; this "
                        f"benchmark's files have the columns {','.join(header)}.")
    return [names.index(name) if name in names else None for name in header], len(names)


def _question(row: list[str], columns: list[int | None], *, width: int, at: str) -> Question:
    if len(row) != width:
        raise _RowError(f"{at}: {len(row)} columns where the file has {width}; quote a cell that holds a comma, a quote "
                        "or a line break (\"...\", a quote inside doubled).")
    answer = row[columns[5]] if columns[5] is not None else ""
    if columns[5] is not None and answer not in CHOICES:
        raise _RowError(f"{at}: the answer {answer!r} is not one of {listed(CHOICES)}.")
    return Question(text=row[columns[0]], choices=tuple(row[i] for i in columns[1:5]), answer=answer)
