"""LongBench loader, metrics and `dllm eval longbench` on hand-computed examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dllm.eval.longbench import (
    classification,
    code_sim,
    count,
    load_longbench,
    metric_for,
    normalize_answer,
    qa_f1,
    retrieval,
    retrieval_zh,
    rouge_l,
    score_longbench,
)

DATA = Path(__file__).parent / "data" / "longbench_tiny.jsonl"


def test_load():
    cases = load_longbench(str(DATA))
    assert len(cases) == 3  # the blank line is skipped
    a, b, c = cases
    assert a.task == a.dataset == "hotpotqa" and a.id == "a1" and a.language == "en"
    assert a.answers == ("on the mat",) and a.answer == "on the mat" and a.all_classes is None
    assert a.query == "\n\nQuestion: Where did the cat sit?\nAnswer: "
    assert a.prompt == a.context + a.query and a.length == 10
    assert b.query == "\n\nAnswer: " and b.input == ""
    assert c.all_classes == ("Human being", "Location", "Human", "Number")
    assert len(load_longbench(str(DATA), limit=1)) == 1
    assert load_longbench(str(DATA), prefix="P: ")[0].prompt.startswith("P: Passage one.")


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing LongBench field"):
        load_longbench(str(bad))
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_longbench(str(bad))
    rec = json.loads(DATA.read_text().splitlines()[0])
    rec["answers"] = "on the mat"
    bad.write_text(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match="answers"):
        load_longbench(str(bad))
    with pytest.raises(FileNotFoundError):
        load_longbench(str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize(
    "field, value",
    [("length", None), ("length", [1]), ("length", True), ("length", "abc"), ("all_classes", 5),
     ("all_classes", "abc"), ("context", None), ("context", ["a"]), ("input", 3), ("dataset", 1)],
)  # fmt: skip
def test_a_field_of_the_wrong_type_names_the_line(tmp_path, field, value):
    good = DATA.read_text().splitlines()[0]
    rec = json.loads(good)
    assert rec[field] != value
    rec[field] = value
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n" + json.dumps(rec) + "\n")  # line 1 loads, line 2 is named
    with pytest.raises(ValueError, match=rf"bad.jsonl:2: LongBench field\(s\) of the wrong type: {field}="):
        load_longbench(str(bad))


def test_a_bom_before_the_first_line_is_skipped(tmp_path):
    with_bom = tmp_path / "bom.jsonl"
    with_bom.write_bytes(b"\xef\xbb\xbf" + DATA.read_bytes())
    assert load_longbench(str(with_bom)) == load_longbench(str(DATA))


def test_normalize_answer():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("An apple a day") == "apple day"


def test_qa_f1():
    # "the cat sat" -> [cat, sat]; "a cat sat down" -> [cat, sat, down]
    # common = 2: P = 2/2 = 1, R = 2/3, F1 = 2 * 1 * (2/3) / (1 + 2/3) = 0.8
    assert qa_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert qa_f1("Paris", "paris.") == 1.0
    assert qa_f1("London", "Paris") == 0.0
    # repeated tokens count once per gold occurrence: pred [a?] "cat cat" vs "cat dog":
    # common = 1, P = 1/2, R = 1/2, F1 = 0.5
    assert qa_f1("cat cat", "cat dog") == pytest.approx(0.5)


def test_rouge_l():
    # tokens: pred [the cat sat on the mat], gold [the cat lay on the mat]
    # LCS = [the cat on the mat] = 5, P = R = 5/6, F = 5/6
    assert rouge_l("The cat sat on the mat.", "the cat lay on the mat") == pytest.approx(5 / 6)
    # pred [a b c d], gold [b d e]: LCS = [b d] = 2, P = 1/2, R = 2/3, F = 2*(1/2)(2/3)/(7/6) = 4/7
    assert rouge_l("a b c d", "b d e") == pytest.approx(4 / 7)
    assert rouge_l("", "x") == 0.0 and rouge_l("x", "y") == 0.0


def test_classification():
    classes = ["Human being", "Location", "Human", "Number"]
    # "Human" is a proper substring of the gold "Human being", so it is dropped: k = 1
    assert classification("Human being", "Human being", all_classes=classes) == 1.0
    # two labels left (Human being, Location): 1/2
    assert classification("Human being or Location", "Human being", all_classes=classes) == 0.5
    assert classification("Number", "Human being", all_classes=classes) == 0.0
    # gold "Human": "Human being" is not a substring of it, both found: 1/2
    assert classification("Human being", "Human", all_classes=classes) == 0.5
    with pytest.raises(ValueError):
        classification("x", "y")


def test_retrieval_count_code_sim():
    assert retrieval("Paragraph 2", "Paragraph 2") == 1.0
    assert retrieval("Paragraph 2 or paragraph 3", "Paragraph 2") == 0.5
    assert retrieval("none", "Paragraph 2") == 0.0
    assert retrieval_zh("段落5", "段落5") == 1.0
    assert count("There are 4 unique paragraphs; 4.", "4") == 1.0
    assert count("3 or 4", "4") == 0.5
    # the first line without a comment/fence is compared: "x = 1" vs "x = 1" -> 1.0
    assert code_sim("```python\n# hi\nx = 1\ny", "x = 1") == 1.0
    # "abcd" vs "abce": 3 matching chars of 8 total -> 2*3/8 = 0.75
    assert code_sim("abcd", "abce") == pytest.approx(0.75)


def test_score_longbench_dispatch():
    cases = load_longbench(str(DATA))
    assert score_longbench("hotpotqa", "on the mat", cases[0].answers) == 1.0
    assert score_longbench("hotpotqa_e", "wrong; on the mat", ["x", "on the mat"]) == pytest.approx(
        qa_f1("wrong; on the mat", "on the mat")
    )
    # trec scores only the first line
    assert score_longbench("trec", "\nHuman being\nLocation", cases[2].answers, cases[2].all_classes) == 1.0
    assert metric_for("passage_count") is count
    with pytest.raises(ValueError, match="jieba"):
        metric_for("dureader")
    with pytest.raises(ValueError, match="unknown LongBench dataset"):
        metric_for("nope")


# --------------------------------------------------------------------------- dllm eval longbench


@pytest.fixture(scope="module")
def tiny():
    import dllm

    return dllm.load_model(device="cpu")


def test_evaluate_longbench_scores_each_example_with_its_dataset_metric(tiny, monkeypatch):
    from types import SimpleNamespace

    import dllm.eval.evaluation as ev

    calls = []

    def fake_generate(model, input_ids=None, *, method, gen_length, **kw):
        calls.append((tiny.tokenizer.decode(input_ids[0].tolist()), gen_length, kw.get("seed")))
        stats = SimpleNamespace(seconds={"total": 0.5}, nfe=7, extra={})
        return SimpleNamespace(text=["on the mat\nParagraph 2"], stats=stats)

    monkeypatch.setattr(ev, "generate", fake_generate)
    rows = ev.evaluate_longbench(tiny, str(DATA), "dense", sampling_seed=5, steps=4)
    assert [r.dataset for r in rows] == ["hotpotqa", "passage_retrieval_en", "trec"]
    # hotpotqa, qa_f1: pred [on, mat, paragraph, 2] vs gold [on, mat]: P = 2/4, R = 1, F1 = 2/3
    # passage_retrieval_en: the one integer of the prediction is the gold paragraph 2: 1.0
    # trec scores the first line only, "on the mat": no label of all_classes in it: 0.0
    assert [r.score for r in rows] == [pytest.approx(2 / 3), 1.0, 0.0]
    # LongBench's response lengths (dataset2maxlen): hotpotqa 32, passage_retrieval_en 32, trec 64
    assert [n for _, n, _ in calls] == [32, 32, 64] and {s for _, _, s in calls} == {5}
    assert calls[0][0].endswith(
        "Passage one. The cat sat on the mat all day.\n\nQuestion: Where did the cat sit?\nAnswer: "
    )
    assert rows[1].gold == "Paragraph 2" and rows[0].id == "a1" and rows[0].nfe == 7
    assert rows[0].context_tokens == len("Passage one. The cat sat on the mat all day.")  # character-level model
    assert len(ev.evaluate_longbench(tiny, str(DATA), limit=1, gen_length=4)) == 1 and calls[-1][1] == 4


def test_evaluate_longbench_rejects_unsupported_sets_before_decoding(tiny, tmp_path, monkeypatch):
    import dllm.eval.evaluation as ev

    monkeypatch.setattr(ev, "generate", lambda *a, **k: pytest.fail("decoded before the check"))
    rec = json.loads(DATA.read_text().splitlines()[0])
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "dataset": "dureader"}) + "\n")
    with pytest.raises(ValueError, match="jieba"):
        ev.evaluate_longbench(tiny, str(path))
    with pytest.raises(ValueError, match="no LongBench examples"):
        ev.evaluate_longbench(tiny, str(DATA), limit=0)


def test_cli_eval_longbench_writes_scored_rows(tmp_path, capsys):
    import csv

    from dllm.cli import main

    out = tmp_path / "lb.csv"
    argv = ["eval", "longbench", "--data", str(DATA), "--method", "dense", "--gen-length", "4", "--steps", "2"]
    argv += ["--out", str(out)]
    assert main(argv) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["dataset"] for r in rows] == ["hotpotqa", "passage_retrieval_en", "trec"]
    cases = load_longbench(str(DATA))
    for r, case in zip(rows, cases):  # each row's score is its dataset's metric on its own answer
        assert float(r["score"]) == pytest.approx(
            score_longbench(r["dataset"], r["answer"], case.answers, case.all_classes)
        )
        assert r["method"] == "dense" and int(r["nfe"]) >= 2
    printed = capsys.readouterr().out
    assert "| dataset | method | score x100 | cases | mean s |" in printed and "| trec | dense |" in printed


@pytest.mark.parametrize("argv", [["eval", "longbench"], ["eval", "passkey", "--data", str(DATA)]])
def test_cli_data_goes_with_longbench_only(argv, capsys):
    from dllm.cli import main

    assert main(argv) == 2 and "--data FILE.jsonl" in capsys.readouterr().err
