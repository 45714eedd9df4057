"""Small benchmarks in LLaMA-Factory's `evaluation/` layout, written for the tests of `tuneline eval`.

- MMLU as extracted folders: mapping.json and data/{dev,val,test}/{subject}_{split}.csv, no header;
- CMMLU as its zip (zh): mapping.json beside cmmlu.zip holding {dev,test}/{subject}.csv with the header
  `,Question,A,B,C,D,Answer` (an index column first);
- C-Eval as its zip: {dev,val,test}/{subject}_{split}.csv with `id,question,A,B,C,D,answer[,explanation]`;
  its test files have no answer column, as C-Eval's own.

Each returns the rows it wrote, {subject: {folder: [row, ...]}}, a row being {question, A, B, C, D, answer},
so a test can build the prompts by hand.
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path

Rows = dict[str, dict[str, list[dict[str, str]]]]

MMLU_SUBJECTS = {"abstract_algebra": ("abstract algebra", "STEM"), "college_physics": ("college physics", "STEM"),
                 "philosophy": ("philosophy", "Humanities")}
CMMLU_SUBJECTS = {"agronomy": ("农学", "Other"), "chinese_history": ("中国历史", "Humanities")}
CEVAL_SUBJECTS = {"law": ("法学", "Humanities"), "college_physics": ("大学物理", "STEM")}
EN_WORDS = ("the model reads a short question about energy and time then it picks one answer from four choices "
            "while the data stays small").split()
ZH_WORDS = "模型 读取 一个 关于 历史 和 农业 的 简短 问题 然后 从 四个 选项 中 选出 答案".split()
ANSWERS = "ABCDDCBACABD"
COUNTS = {"dev": 5, "val": 3, "test": 8}


def question_rows(subject: str, folder: str, *, zh: bool = False) -> list[dict[str, str]]:
    """COUNTS[folder] rows of made-up text, their answers spread over A-D; the first test row's
    question holds a comma, a quote and a line break (a quoted CSV cell)."""
    words = ZH_WORDS if zh else EN_WORDS
    joiner = "" if zh else " "
    rows = []
    for i in range(COUNTS[folder]):
        seed = len(subject) * 7 + len(folder) * 3 + i * 5
        pick = [words[(seed + k * 3) % len(words)] for k in range(6)]
        question = joiner.join(pick) + ("？" if zh else "?")
        if folder == "test" and i == 0:
            question = f'{question[:-1]}, "quoted"\nsecond line?'
        choices = {letter: joiner.join(words[(seed + j + n) % len(words)] for n in range(2)) for j, letter in enumerate("ABCD")}
        rows.append({"question": question, **choices, "answer": ANSWERS[(seed + i) % len(ANSWERS)]})
    return rows


def write_mmlu(task_dir: Path, *, folders: tuple[str, ...] = ("dev", "val", "test")) -> Rows:
    root = task_dir / "mmlu"
    _write_mapping(root, MMLU_SUBJECTS)
    written: Rows = {}
    for subject in MMLU_SUBJECTS:
        written[subject] = {}
        for folder in folders:
            rows = question_rows(subject, folder)
            path = root / "data" / folder / f"{subject}_{folder}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_csv([[r["question"], r["A"], r["B"], r["C"], r["D"], r["answer"]] for r in rows]),
                            encoding="utf-8")
            written[subject][folder] = rows
    return written


def write_cmmlu(task_dir: Path) -> Rows:
    root = task_dir / "cmmlu"
    _write_mapping(root, CMMLU_SUBJECTS)
    written: Rows = {}
    with zipfile.ZipFile(root / "cmmlu.zip", "w") as archive:
        for subject in CMMLU_SUBJECTS:
            written[subject] = {}
            for folder in ("dev", "test"):
                rows = question_rows(subject, folder, zh=True)
                table = [["", "Question", "A", "B", "C", "D", "Answer"]]
                table += [[str(i), r["question"], r["A"], r["B"], r["C"], r["D"], r["answer"]] for i, r in enumerate(rows)]
                archive.writestr(f"{folder}/{subject}.csv", _csv(table))
                written[subject][folder] = rows
    return written


def write_ceval(task_dir: Path) -> Rows:
    root = task_dir / "ceval"
    _write_mapping(root, CEVAL_SUBJECTS)
    written: Rows = {}
    headers = {"dev": ["id", "question", "A", "B", "C", "D", "answer", "explanation"],
               "val": ["id", "question", "A", "B", "C", "D", "answer"], "test": ["id", "question", "A", "B", "C", "D"]}
    with zipfile.ZipFile(root / "ceval.zip", "w") as archive:
        for subject in CEVAL_SUBJECTS:
            written[subject] = {}
            for folder, header in headers.items():
                rows = question_rows(subject, folder, zh=True)
                cells = [[str(i), r["question"], r["A"], r["B"], r["C"], r["D"], r["answer"], "解析"][:len(header)]
                         for i, r in enumerate(rows)]
                archive.writestr(f"{folder}/{subject}_{folder}.csv", _csv([header, *cells]))
                written[subject][folder] = rows
    return written


def _write_mapping(root: Path, subjects: dict[str, tuple[str, str]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    mapping = {key: {"name": name, "category": category} for key, (name, category) in subjects.items()}
    (root / "mapping.json").write_text(json.dumps(mapping, ensure_ascii=False, indent=4), encoding="utf-8")


def _csv(table: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(table)
    return out.getvalue()
