"""LongBench (Bai et al., 2023): load its JSONL files from a local path and score predictions.

LongBench cannot be downloaded here; point :func:`load_longbench` at a local
copy of one of its ``<dataset>.jsonl`` files (``python -m dllm eval longbench
--data FILE.jsonl`` runs one through :func:`dllm.eval.evaluation.evaluate_longbench`).
Each line is an object with ``input`` (the question, may be empty),
``context`` (the long text), ``answers`` (list of gold strings),
``all_classes`` (labels of the classification sets, else null), ``length``
(words for English, characters for Chinese) and ``dataset``; ``_id`` and
``language`` are optional.

The metrics are written from their definitions (:data:`DATASET_METRICS`
names each dataset's); each returns a float in [0, 1] (LongBench reports 100
times the mean). The Chinese ``qa_f1_zh`` and ``rouge_zh`` (multifieldqa_zh,
dureader, vcsum) need the jieba word segmenter and are not supported.
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dllm.eval.tasks.case import PromptCase
from dllm.model.json_files import parse_json

__all__ = [
    "LongBenchCase",
    "load_longbench",
    "normalize_answer",
    "qa_f1",
    "rouge_l",
    "classification",
    "retrieval",
    "retrieval_zh",
    "count",
    "code_sim",
    "DATASETS",
    "DATASET_METRICS",
    "FIRST_LINE_DATASETS",
    "MAX_NEW_TOKENS",
    "base_name",
    "metric_for",
    "score_longbench",
]


@dataclass(frozen=True)
class LongBenchCase(PromptCase):
    """One LongBench example, laid out like :class:`~dllm.eval.tasks.case.TaskCase`.

    Fields:
        task: the dataset name (same as ``dataset``).
        prefix: text before the context ("" by default).
        context: the long text.
        query: text after the context, built from ``input`` by the loader's
            ``query_template``; the answer follows it.
        answer: the first gold answer.
        answers: all gold answers (a prediction scores its best match).
        all_classes: the label set for classification datasets, else None.
        length: LongBench's ``length`` field (words; characters for Chinese),
            not tokens.
        dataset: the dataset name from the file (``_e`` suffix of LongBench-E kept).
        input: the raw ``input`` field (the question; may be empty).
        id: the ``_id`` field ("" if absent).
        language: the ``language`` field ("" if absent).
        line: the example's line in its file (1-based; 0 when it was not read from a file), for messages
            that name ``file:line``.
    """

    answers: tuple[str, ...]
    all_classes: tuple[str, ...] | None
    length: int
    dataset: str
    input: str = ""
    id: str = ""
    language: str = ""
    line: int = 0


_REQUIRED = ("input", "context", "answers", "all_classes", "length", "dataset")


def load_longbench(
    path: str,
    *,
    limit: int | None = None,
    prefix: str = "",
    query_template: str = "\n\nQuestion: {input}\nAnswer: ",
    empty_input_query: str = "\n\nAnswer: ",
) -> list[LongBenchCase]:
    """Read a LongBench JSONL file from a local path (no download).

    Args:
        path: path of a ``.jsonl`` file, one JSON object per line (blank lines skipped).
        limit: read at most this many examples (None: all).
        prefix: instruction put before every context.
        query_template: query text after the context, with ``{input}`` for the
            question; the answer follows it directly.
        empty_input_query: the query when ``input`` is empty (summarisation,
            code completion).

    Returns:
        A list of :class:`LongBenchCase` in file order.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is not a JSON object, lacks one of the fields
            ``input, context, answers, all_classes, length, dataset``, or has
            ``answers`` that is not a list (the message gives the line number).

    Source: LongBench data format (THUDM/LongBench).
    """
    cases: list[LongBenchCase] = []
    with open(path, encoding="utf-8-sig") as f:  # a BOM before the first line is skipped
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(cases) >= limit:
                break
            if not line.strip():
                continue
            rec = parse_json(line, f"{path}:{lineno}")
            missing = [k for k in _REQUIRED if k not in rec]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing LongBench field(s) {missing}")
            answers = rec["answers"]
            if not isinstance(answers, list) or not answers:
                raise ValueError(f"{path}:{lineno}: 'answers' must be a non-empty list")
            classes = rec["all_classes"]
            bad = [
                f"{k}={rec[k]!r}"
                for k, ok in (
                    ("context", isinstance(rec["context"], str)),
                    ("input", rec["input"] is None or isinstance(rec["input"], str)),
                    ("dataset", isinstance(rec["dataset"], str)),
                    ("all_classes", classes is None or isinstance(classes, list)),
                    ("length", isinstance(rec["length"], int) and not isinstance(rec["length"], bool)),
                )
                if not ok
            ]
            if bad:
                raise ValueError(f"{path}:{lineno}: LongBench field(s) of the wrong type: {'; '.join(bad)[:200]}")
            question = str(rec["input"] or "")
            query = query_template.format(input=question) if question.strip() else empty_input_query
            cases.append(
                LongBenchCase(
                    task=str(rec["dataset"]),
                    prefix=prefix,
                    context=str(rec["context"]),
                    query=query,
                    answer=str(answers[0]),
                    answers=tuple(str(a) for a in answers),
                    all_classes=tuple(str(c) for c in classes) if classes else None,
                    length=int(rec["length"]),
                    dataset=str(rec["dataset"]),
                    input=question,
                    id=str(rec.get("_id", "")),
                    language=str(rec.get("language", "")),
                    line=lineno,
                )
            )
    return cases


# --------------------------------------------------------------------------- metrics

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD-style answer normalisation: lowercase, remove ASCII punctuation,
    remove the articles a/an/the, collapse whitespace."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def qa_f1(prediction: str, ground_truth: str, **_: object) -> float:
    """Token-level F1 between normalised prediction and answer (LongBench ``qa_f1_score``).

    Both are normalised (:func:`normalize_answer`) and split on whitespace;
    with c the size of the multiset intersection, precision = c / #pred,
    recall = c / #gold, F1 = 2PR / (P + R); 0 when c = 0.
    """
    pred = normalize_answer(prediction).split()
    gold = normalize_answer(ground_truth).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    p, r = common / len(pred), common / len(gold)
    return 2 * p * r / (p + r)


def _lcs_len(a: Sequence[str], b: Sequence[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


_WORD = re.compile(r"[a-z0-9]+")


def rouge_l(prediction: str, ground_truth: str, **_: object) -> float:
    """ROUGE-L F1 (LongBench ``rouge_score``, English sets).

    Tokens are the lowercased alphanumeric runs; with L the length of the
    longest common subsequence, P = L / #pred, R = L / #gold and the score is
    2PR / (P + R) (0 when either side has no tokens or L = 0).
    """
    pred = _WORD.findall(prediction.lower())
    gold = _WORD.findall(ground_truth.lower())
    if not pred or not gold:
        return 0.0
    lcs = _lcs_len(pred, gold)
    if lcs == 0:
        return 0.0
    p, r = lcs / len(pred), lcs / len(gold)
    return 2 * p * r / (p + r)


def classification(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None, **_: object) -> float:
    """LongBench ``classification_score`` (trec, lsht).

    The labels of ``all_classes`` that occur in ``prediction`` (substring) are
    collected; labels that are proper substrings of ``ground_truth`` are
    dropped; the score is 1/k when ``ground_truth`` is among the k labels left,
    else 0. Raises ``ValueError`` when ``all_classes`` is missing.
    """
    if not all_classes:
        raise ValueError("classification needs all_classes (the dataset's label set)")
    found = [c for c in all_classes if c in prediction]
    found = [c for c in found if not (c in ground_truth and c != ground_truth)]
    return 1.0 / len(found) if ground_truth in found else 0.0


def _share_equal(prediction: str, gold: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    if not numbers:
        return 0.0
    return sum(n == gold for n in numbers) / len(numbers)


def _paragraph(ground_truth: str, label: str) -> str:
    m = re.search(label + r"(\d+)", ground_truth)
    return m.group(1) if m else ground_truth.strip()


def retrieval(prediction: str, ground_truth: str, **_: object) -> float:
    """LongBench ``retrieval_score`` (passage_retrieval_en): the gold paragraph
    number is read from "Paragraph N" in ``ground_truth``; the score is the
    share of integers in ``prediction`` equal to N (0 when none)."""
    return _share_equal(prediction, _paragraph(ground_truth, "Paragraph "))


def retrieval_zh(prediction: str, ground_truth: str, **_: object) -> float:
    """As :func:`retrieval` for passage_retrieval_zh, whose gold labels read "段落N"."""
    return _share_equal(prediction, _paragraph(ground_truth, "段落"))


def count(prediction: str, ground_truth: str, **_: object) -> float:
    """LongBench ``count_score`` (passage_count): the share of integers in
    ``prediction`` equal to the gold count (0 when there are none)."""
    return _share_equal(prediction, str(ground_truth).strip())


def code_sim(prediction: str, ground_truth: str, **_: object) -> float:
    """LongBench ``code_sim_score`` (lcc, repobench-p).

    The prediction's first line (leading newlines skipped) that contains none
    of "`", "#", "//" is compared with ``ground_truth`` by
    ``difflib.SequenceMatcher(None, line, gold).ratio()`` (LongBench uses
    fuzzywuzzy's ``fuzz.ratio`` / 100, the same ratio, rounded). An empty string
    is compared when no line qualifies.
    """
    line = ""
    for cand in prediction.lstrip("\n").split("\n"):
        if "`" not in cand and "#" not in cand and "//" not in cand:
            line = cand
            break
    return difflib.SequenceMatcher(None, line, ground_truth).ratio()


DATASETS: dict[str, tuple[Callable[..., float], int]] = {
    # dataset: (metric, response length in tokens: LongBench's dataset2maxlen)
    "narrativeqa": (qa_f1, 128), "qasper": (qa_f1, 128), "multifieldqa_en": (qa_f1, 64),
    "hotpotqa": (qa_f1, 32), "2wikimqa": (qa_f1, 32), "musique": (qa_f1, 32), "triviaqa": (qa_f1, 32),
    "gov_report": (rouge_l, 512), "qmsum": (rouge_l, 512), "multi_news": (rouge_l, 512), "samsum": (rouge_l, 128),
    "trec": (classification, 64), "lsht": (classification, 64),
    "passage_retrieval_en": (retrieval, 32), "passage_retrieval_zh": (retrieval_zh, 32), "passage_count": (count, 32),
    "lcc": (code_sim, 64), "repobench-p": (code_sim, 64),
}  # fmt: skip
"""The LongBench datasets this module scores (LongBench-E names with ``_e`` map the same way)."""
DATASET_METRICS: dict[str, Callable[..., float]] = {name: metric for name, (metric, _) in DATASETS.items()}
MAX_NEW_TOKENS: dict[str, int] = {name: n for name, (_, n) in DATASETS.items()}

FIRST_LINE_DATASETS = frozenset({"trec", "triviaqa", "samsum", "lsht"})
"""Datasets for which LongBench scores only the prediction's first line."""

_UNSUPPORTED = {"multifieldqa_zh": "qa_f1_zh", "dureader": "rouge_zh", "vcsum": "rouge_zh"}


def base_name(dataset: str) -> str:
    """The LongBench name of a LongBench-E dataset (``hotpotqa_e`` -> ``hotpotqa``)."""
    return dataset[:-2] if dataset.endswith("_e") else dataset


def metric_for(dataset: str) -> Callable[..., float]:
    """The metric function LongBench uses for ``dataset``.

    Raises:
        ValueError: unknown dataset, or a Chinese set whose metric needs jieba
            (multifieldqa_zh, dureader, vcsum).
    """
    base = base_name(dataset)
    if base in _UNSUPPORTED:
        raise ValueError(f"LongBench dataset {dataset!r} uses {_UNSUPPORTED[base]}, which needs jieba; unsupported")
    try:
        return DATASET_METRICS[base]
    except KeyError:
        raise ValueError(f"unknown LongBench dataset {dataset!r}; known: {sorted(DATASET_METRICS)}") from None


def score_longbench(
    dataset: str,
    prediction: str,
    answers: Sequence[str] | str,
    all_classes: Sequence[str] | None = None,
) -> float:
    """Score one prediction the LongBench way: the dataset's metric against each
    gold answer, best one kept (first line only for trec, triviaqa, samsum, lsht).

    Args:
        dataset: LongBench dataset name (e.g. "hotpotqa", "passage_count").
        prediction: generated text.
        answers: gold answer or answers.
        all_classes: the label set (classification datasets).

    Returns:
        A score in [0, 1].

    Raises:
        ValueError: see :func:`metric_for`; classification without all_classes.
    """
    metric = metric_for(dataset)
    if base_name(dataset) in FIRST_LINE_DATASETS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    golds = [answers] if isinstance(answers, str) else list(answers)
    return max((metric(prediction, g, all_classes=all_classes) for g in golds), default=0.0)
