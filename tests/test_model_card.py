"""bench.tiny.model_card: the card can be rewritten from a recorded evaluation CSV."""

from bench.tiny.model_card import read_rows
from dllm.eval.evaluation import EvalRow, write_csv


def test_read_rows_returns_what_write_csv_wrote(tmp_path):
    rows = [
        EvalRow("passkey", 512, 0.25, "dense", 2**31, True, "12345", "12345", 0.5, 9, 508),
        EvalRow("kv_retrieval", 1024, 1 / 9, "prefilling", 7, False, '"ab, "c', "x-y", 2.25, 40, 1000, "3 7"),
    ]
    path = tmp_path / "eval.csv"
    write_csv(rows, str(path), provenance={"device": "cpu"})  # extra columns are ignored on the way back
    back = read_rows(str(path))
    assert back == rows
    assert back[0].correct is True and back[1].correct is False and isinstance(back[1].depth, float)


def test_skill_table_embeds_the_recorded_probe_table(tmp_path, monkeypatch):
    import bench.tiny.model_card as card

    md = tmp_path / "probe.md"
    monkeypatch.setattr(card, "SKILL_MD", str(md))
    assert "not recorded" in card._skill_table()
    md.write_text("# title\n\nintro line\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert card._skill_table() == "| a | b |\n|---|---|\n| 1 | 2 |"
