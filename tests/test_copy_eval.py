"""bench.fidelity.copy_eval's pieces checked against values computed here from the text: the needle lies in the chunk
reported as holding it, column (c)'s prompt is the kept chunks' tokens in document order, (d) ends with the
needle's chunk, (e)'s crop holds the needle in 1024 characters, (g) joins the needle's chunk to unkept ones,
and the haystacks come from held-out sources."""

from __future__ import annotations

import functools
import re

import pytest
import torch

import dllm
from bench.fidelity.copy_eval import (
    CROP,
    DEPTHS,
    GRID_SLOTS,
    HAYSTACK_SOURCES,
    HAYSTACKS,
    SEED_BASE,
    TASKS,
    adaptive_k_arg,
    answer_kind,
    centred_crop,
    changelog_case,
    changelogs,
    compare_table,
    dense_prompts,
    evaluate_case,
    grid,
    make_copy_case,
    needle_chunks,
    occurs_elsewhere,
    ordered_spans,
    paired_table,
    read_rows,
    sign_test_p,
    tables,
)
from bench.provenance import write_csv
from bench.tiny.sources import HELD_OUT_SOURCES, TRAINING_SOURCES
from dllm.eval.tasks.reports import dictionary_sentences
from dllm.model.loader import default_model_dir
from dllm.prefilling import PrefillingConfig, chunk_char_spans


@functools.cache
def _model():
    torch.set_num_threads(1)
    return dllm.load_model(device="cpu", dtype=torch.float32)


@functools.cache
def _cfg():
    return PrefillingConfig.from_pretrained(default_model_dir())


def _has_changelogs() -> bool:
    try:
        changelogs()
    except FileNotFoundError:
        return False
    return True


def test_haystacks_are_whole_held_out_sources():
    assert set(GRID_SLOTS) == set(HAYSTACKS) == set(HAYSTACK_SOURCES)
    for sources in HAYSTACK_SOURCES.values():
        for name in sources:
            assert name in HELD_OUT_SOURCES and name not in TRAINING_SOURCES
            assert name not in ("essays", "pydoc")  # held out as a split only: their other split was trained


def test_devil_haystacks_read_the_dictionary_and_differ_in_their_numbers():
    sentences = set(dictionary_sentences())
    plain = make_copy_case("devil", "passkey", 4096, 0.5, SEED_BASE)
    dense = make_copy_case("devil-registers", "passkey", 4096, 0.5, SEED_BASE)
    for case in (plain, dense):
        assert case.context.count(case.answer) >= 1 and not occurs_elsewhere(
            case.context, case.needle_start, case.needle_end, case.answer
        )
        prose = [s for s in sentences if s in case.context]
        assert sum(map(len, prose)) > 0.3 * len(case.context)  # the dictionary's sentences make the prose
    digits = [len(re.findall(r"\d+", c.context)) for c in (plain, dense)]
    assert 0 < digits[0] < digits[1] / 3  # dates and numbers in both, many more in the registers


@pytest.mark.skipif(not _has_changelogs(), reason="no /usr/share/doc/*/changelog.Debian.gz on this machine")
def test_changelog_case_is_changelog_lines_with_the_needle_a_line_and_a_unique_answer():
    for task in TASKS:
        case = changelog_case(task, 4096, 0.5, SEED_BASE)
        assert len(case.context) <= 4096 and len(case.answer) == (5 if task == "passkey" else 10)
        assert case.context[case.needle_start - 1] == "\n" and case.context[case.needle_end] == "\n"
        assert case.answer in case.needle
        rest = case.context[: case.needle_start] + case.context[case.needle_end :]
        assert all(case.answer not in run for run in re.findall(r"\d+", rest))
        assert len(re.findall(r"\d+", rest)) > 20  # versions, dates, bug numbers all over it
        lines = [ln for ln in rest.split("\n")[1:-1] if ln.strip()]  # the first and last may be cut
        text = "\n".join(changelogs())
        assert all(ln in text for ln in lines)
        assert case == changelog_case(task, 4096, 0.5, SEED_BASE)  # seeded


def test_grid_covers_haystacks_tasks_depths_with_distinct_seeds():
    g = grid(4096, 40)
    assert len(g) == len(set(g)) == 40
    assert {(h, t, d) for h, t, d, _ in g} == {(h, t, d) for h in HAYSTACKS for t in TASKS for d in DEPTHS}
    assert sum(h == "devil" for h, *_ in g) == 20
    assert {s for h, *_, s in g if h != "devil"} == {SEED_BASE}
    for n in (10, 20):  # a run cut short still has every haystack, task and depth
        part = grid(4096, n)
        assert part == g[:n]
        assert {h for h, *_ in part} == set(HAYSTACKS) and {t for _, t, _, _ in part} == set(TASKS)
        assert {d for _, _, d, _ in part} == set(DEPTHS)
    assert {(t, d) for h, t, d, _ in g[:20] if h == "devil"} == {(t, d) for t in TASKS for d in DEPTHS}


def test_tuning_grid_is_the_same_cells_with_other_seeds():
    g, tune = grid(4096, 40), grid(4096, 40, first_seed=1000)
    assert [c[:3] for c in tune] == [c[:3] for c in g]
    assert [c[3] - 1000 for c in tune] == [c[3] for c in g]
    h, t, d, s = tune[0]
    assert make_copy_case(h, t, 4096, d, s).context != make_copy_case(h, t, 4096, d, g[0][3]).context


def test_pure_pieces():
    spans = [(0, 10), (10, 25), (25, 40), (40, 52)]
    assert needle_chunks(spans, 12, 20) == [1] and needle_chunks(spans, 20, 30) == [1, 2]
    kept = [[40, 52], [0, 10], [25, 40]]
    assert ordered_spans(kept, [], False) == [(0, 10), (25, 40), (40, 52)]
    assert ordered_spans(kept, [(0, 10)], True) == [(25, 40), (40, 52), (0, 10)]
    text = "".join(chr(97 + i % 26) for i in range(3000))
    for s, e in ((0, 5), (1500, 1540), (2990, 3000)):
        crop, off = centred_crop(text, s, e)
        assert len(crop) == CROP and text[s:e] in crop and crop == text[off : off + CROP]
    assert centred_crop("short text", 0, 5) == ("short text", 0)
    case = make_copy_case("devil-registers", "passkey", 4096, 0.5, SEED_BASE)
    other = re.findall(r"\d{5,}", case.context[: case.needle_start])[0]
    assert answer_kind(case.answer + ".", case) == "right"
    assert answer_kind(other, case) == "distractor"
    off_by_one = case.answer[:-1] + str((int(case.answer[-1]) + 1) % 10)
    assert answer_kind(off_by_one, case) in ("near", "distractor")
    assert answer_kind("no number", case) == "other"


def _ids(text: str, bos: bool = False) -> list[int]:
    return dllm.encode_text(_model(), text, bos=bos).tolist()


@pytest.mark.parametrize("haystack", ["devil", "devil-registers"])
def test_prompts_of_c_d_e_f_from_the_kept_spans(haystack):
    model, cfg = _model(), _cfg()
    case = make_copy_case(haystack, "number_string", 4096, 0.5, SEED_BASE)
    chars = chunk_char_spans(model, case.context, cfg)
    # the needle's chunk, found here from the text: the chunk whose characters hold the answer's first digit
    at = case.context.index(case.answer)
    holding = [j for j, (a, b) in enumerate(chars) if a <= at < b]
    assert len(holding) == 1
    j = holding[0]
    kept = sorted({0, j, len(chars) - 1, (j + 3) % len(chars)})  # the needle chunk among others, not last
    assert j != kept[-1]
    extra = {"selected_chunk_tokens": [list(chars[k]) for k in reversed(kept)]}
    p = dense_prompts(model, case, extra, cfg)
    assert p.kept == kept and j in p.fact
    a, b = p.chunk_spans[j]
    assert a <= case.needle_start and case.needle_end <= b or len(p.fact) > 1
    assert case.answer in case.context[a:b]
    pieces = "".join(case.context[chars[k][0] : chars[k][1]] for k in kept)
    assert p.dense["c"][0].tolist() == _ids(case.prefix, bos=True) + _ids(pieces) + _ids(case.query)
    last = "".join(case.context[chars[k][0] : chars[k][1]] for k in kept if k not in p.fact)
    last += "".join(case.context[chars[k][0] : chars[k][1]] for k in kept if k in p.fact)
    d = p.dense["d"][0].tolist()
    assert d == _ids(case.prefix, bos=True) + _ids(last) + _ids(case.query)
    q = len(_ids(case.query))
    needle_text = "".join(case.context[chars[k][0] : chars[k][1]] for k in p.fact)
    assert d[-q - len(needle_text) : -q] == _ids(needle_text)  # the needle's chunk just before the query
    assert sorted(d) == sorted(p.dense["c"][0].tolist())
    assert p.dense["f"][0].tolist() == _ids(case.prefix, bos=True) + _ids(needle_text) + _ids(case.query)
    assert len(p.others) == len(kept) - 1 and not set(p.others) & (set(kept) | set(p.fact))
    random_text = "".join(case.context[chars[k][0] : chars[k][1]] for k in sorted(p.others + p.fact))
    assert p.dense["g"][0].tolist() == _ids(case.prefix, bos=True) + _ids(random_text) + _ids(case.query)
    assert p.others == dense_prompts(model, case, extra, cfg).others  # seeded by the case
    assert len(p.crop) == min(CROP, len(case.context)) and case.needle in p.crop and p.crop in case.context
    assert p.dense["e"][0].tolist() == _ids(case.prefix + p.crop + case.query, bos=True)
    # a needle chunk not kept: only (e) is decoded
    none = dense_prompts(model, case, {"selected_chunk_tokens": [list(chars[k]) for k in kept if k != j]}, cfg)
    assert set(none.dense) == {"e"}


def test_one_case_end_to_end_reports_the_kept_chunk_spans_of_the_run():
    model, cfg = _model(), _cfg()
    case = make_copy_case("devil", "passkey", 4096, 0.3, SEED_BASE)
    row = evaluate_case(model, case, cfg, "devil")
    chars = chunk_char_spans(model, case.context, cfg)
    res = dllm.generate(
        model, method="prefilling", prompt=dllm.PromptParts(
            dllm.encode_text(model, case.prefix, bos=True), dllm.encode_text(model, case.context),
            dllm.encode_text(model, case.query)), prefilling=cfg, gen_length=len(case.answer) + 4,
        steps=len(case.answer) + 4,
    )  # fmt: skip
    kept = res.stats.extra["selected_chunks"]
    assert row["kept_chunks"] == " ".join(map(str, kept)) and row["b_answer"] == res.text[0]
    assert [list(chars[k]) for k in kept] == res.stats.extra["selected_chunk_tokens"]
    fact = [int(x) for x in row["needle_chunks"].split()]
    assert all(chars[k][0] < case.needle_end and chars[k][1] > case.needle_start for k in fact)
    assert row["kept"] == bool(set(fact) & set(kept))
    if row["kept"]:
        assert row["c_answer"] and row["d_answer"] and row["f_answer"] and row["g_answer"]
        if row["needle_last"]:
            assert row["d_answer"] == row["c_answer"]
    else:
        assert row["c_answer"] == row["d_answer"] == row["f_answer"] == row["g_answer"] == ""
        assert not (row["c_correct"] or row["g_correct"])
    assert row["crop_chars"] == CROP


def _compare_row(length, haystack, kept, b, e, chunks):
    return {"length": str(length), "haystack": haystack, "kept": kept, "b_correct": b, "e_correct": e,
            "kept_chunks": " ".join(map(str, range(chunks)))}  # fmt: skip


def test_compare_table_counts_each_setting_where_its_chunk_was_kept():
    runs = {
        "K=4": [_compare_row(4096, "devil", True, False, True, 4), _compare_row(4096, "devil", True, True, True, 4),
                _compare_row(4096, "devil-registers", False, False, False, 4)],
        "ak": [_compare_row(4096, "devil", True, True, True, 2), _compare_row(4096, "devil", True, True, True, 1),
               _compare_row(4096, "devil-registers", True, False, False, 3)],
    }  # fmt: skip
    lines = compare_table(runs).splitlines()
    # K=4: kept 2 of 3, (b) 1 of the 2, (e) 2 of the 2: -50 points; (b) over all 1 of 3; chunks 4
    assert "| 4096 | K=4 | 3 | 2 | 50% (1/2) | 100% (2/2) | -50 | 33% (1/3) | 4.0 |" in lines
    assert "| all | ak | 3 | 3 | 67% (2/3) | 67% (2/3) | +0 | 67% (2/3) | 2.0 |" in lines
    devil = compare_table(runs, "devil").splitlines()
    assert "| 4096 | ak | 2 | 2 | 100% (2/2) | 100% (2/2) | +0 | 100% (2/2) | 1.5 |" in devil


def test_compare_reads_the_runs_csvs_and_adaptive_k_off_is_a_fixed_k(tmp_path, capsys):
    from bench.fidelity.copy_eval import main

    keys = {
        "needle_last": False,
        "command": "python -m bench.fidelity.copy_eval",
        **{f"{c}_correct": False for c in "bcdefg"},
    }
    write_csv(tmp_path / "a.csv", [{**_compare_row(4096, "devil", True, True, False, 2), **keys, "b_correct": True}])
    assert main(["--compare", "x=y=" + str(tmp_path / "a.csv")]) == 0  # a name may hold '='
    assert "| 4096 | x=y | 1 | 1 | 100% (1/1) | 0% (0/1) | +100 | 100% (1/1) | 2.0 |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--compare", str(tmp_path / "a.csv")])
    assert e.value.code == 2 and "expected NAME=CSV" in capsys.readouterr().err
    assert (adaptive_k_arg("off"), adaptive_k_arg(" OFF "), adaptive_k_arg("1.5")) == ("off", "off", 1.5)
    with pytest.raises(ValueError):
        adaptive_k_arg("none")


def test_columns_e_decodes_only_prefilling_and_the_crop_and_the_csv_keeps_not_run_apart_from_wrong(tmp_path):
    model, cfg = _model(), _cfg()
    case = make_copy_case("devil", "passkey", 4096, 0.7, SEED_BASE)
    row = evaluate_case(model, case, cfg, "devil", ("e",))
    g = len(case.answer) + 4
    # independent references: the prefilling run and dense decoding of prefix + crop + query, done here
    res = dllm.generate(
        model, method="prefilling", prompt=dllm.PromptParts(
            dllm.encode_text(model, case.prefix, bos=True), dllm.encode_text(model, case.context),
            dllm.encode_text(model, case.query)), prefilling=cfg, gen_length=g, steps=g,
    )  # fmt: skip
    crop, _ = centred_crop(case.context, case.needle_start, case.needle_end)
    ids = dllm.encode_text(model, case.prefix + crop + case.query, bos=True)[None]
    dense = dllm.generate(model, ids, method="dense", gen_length=g, steps=g).text[0]
    assert (row["b_answer"], row["e_answer"]) == (res.text[0], dense)
    assert row["b_correct"] == (re.findall(r"\d+", res.text[0])[:1] == [case.answer])
    assert row["e_correct"] == (re.findall(r"\d+", dense)[:1] == [case.answer])
    for c in "cdfg":
        assert row[f"{c}_answer"] == "" and row[f"{c}_correct"] is None and row[f"{c}_kind"] is None
    keys = {"command": "python -m bench.fidelity.copy_eval --columns e"}
    write_csv(tmp_path / "copy_eval.csv", [row | keys])
    back = read_rows(str(tmp_path / "copy_eval.csv"))[0][0]
    assert back["c_correct"] is None and back["e_correct"] is row["e_correct"] and back["kept"] is row["kept"]
    line = tables([back]).splitlines()[4]
    assert line.count("not run") == 4 and line.startswith("| 4096 | 1 | ")


def test_compare_refuses_a_run_without_the_crop_column(tmp_path, capsys):
    from bench.fidelity.copy_eval import main

    row = {**_compare_row(4096, "devil", True, True, None, 2), "needle_last": False, "command": "x",
           **{f"{c}_correct": None for c in "cdfg"}}  # fmt: skip
    write_csv(tmp_path / "a.csv", [row])
    with pytest.raises(SystemExit) as e:
        main(["--compare", "x=" + str(tmp_path / "a.csv")])
    assert e.value.code == 2 and "column (e) was not run" in capsys.readouterr().err


def test_sign_test_p_is_the_two_sided_binomial_tail():
    # by hand: 0 of 5 discordant pairs one way: 2 x (1/2)^5; 1 of 10: 2 x (1 + 10) / 1024
    assert sign_test_p(0, 5) == pytest.approx(0.0625)
    assert sign_test_p(9, 1) == pytest.approx(22 / 1024)
    assert sign_test_p(3, 3) == 1.0 and sign_test_p(0, 0) == 1.0


def test_paired_table_pairs_prefilling_and_the_crop_on_the_kept_cases():
    rows = [_compare_row(4096, "devil", True, b, e, 2) for b, e in ((1, 0), (0, 1), (0, 1), (1, 1))]
    rows.append(_compare_row(4096, "devil", False, True, False, 2))  # not kept: left out
    rows.append(_compare_row(16384, "devil", True, True, True, 2))
    lines = paired_table(rows).splitlines()
    # 4096 by hand: differences +1, -1, -1, 0: mean -0.25, sample variance 2.75 / 3, its standard error
    # sqrt(0.9167 / 4) = 0.4787, 1.645 x 0.4787 = 0.7875: -103.7 (clamped at -100) to +53.7 points; 1 win,
    # 2 losses, p = 1
    assert "| 4096 | 4 | 50% (2/4) | 75% (3/4) | -25.0 | -100.0 to +53.7 | 1 | 2 | 1.00 |" in lines
    assert "| 16384 | 1 | 100% (1/1) | 100% (1/1) | +0.0 | +0.0 to +0.0 | 0 | 0 | 1.00 |" in lines
    assert lines[-1].startswith("| all | 5 | 60% (3/5) | 80% (4/5) | -20.0 |")


def test_paired_table_clamps_the_interval_to_rates_and_prints_small_p_as_a_bound():
    # differences +1, 0: mean 0.5, standard error 0.5, 1.645 x 0.5 = 0.8225: -32.2 to +132.2, clamped at +100
    rows = [_compare_row(4096, "devil", True, b, e, 2) for b, e in ((1, 0), (1, 1))]
    assert "| 4096 | 2 | 100% (2/2) | 50% (1/2) | +50.0 | -32.2 to +100.0 | 1 | 0 | 1.00 |" in paired_table(rows)
    rows = [_compare_row(4096, "devil", True, True, False, 2)] * 10  # 10 wins, 0 losses: p = 2 / 1024
    assert paired_table(rows).splitlines()[2].endswith("| 10 | 0 | < 0.01 |")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--report-from", "{tmp}/missing.csv"], "No such file"),
        (["--report-from", "{tmp}"], "Is a directory"),
        (["--compare", "A={tmp}/missing.csv"], "No such file"),
        (["--compare", "A="], "expected NAME=CSV"),
        (["--compare", "={tmp}/a.csv"], "expected NAME=CSV"),
        (["--compare", "A={tmp}/other.csv"], "is not a copy_eval.csv: no column 'kept'"),
        (["--report-from", "{tmp}/other.csv"], "is not a copy_eval.csv: no column 'kept'"),
        (["--cases-for", "4096"], "expected LENGTH=N"),
        (["--cases-for", "x=y"], "expected LENGTH=N"),
    ],
)
def test_cli_user_errors_are_one_error_line_and_exit_2(tmp_path, capsys, args, says):
    from bench.fidelity.copy_eval import main

    write_csv(tmp_path / "other.csv", [{"length": "4096", "haystack": "devil", "answer": "1"}])  # another CSV
    with pytest.raises(SystemExit) as e:
        main([a.format(tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("copy_eval") or "error:" in line][-1].count(
        "error:"
    ) == 1
