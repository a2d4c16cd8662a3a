"""``bench.speed.answer_length`` runs end to end at toy sizes and its tables hold what its rows say."""

import csv

import pytest
import torch

from bench.speed import answer_length, flop_model
from bench.speed.e2e_dream_shape import dream7b_config


def test_answer_length_smoke(tmp_path):
    threads = torch.get_num_threads()
    try:
        answer_length.main(
            [
                "--out",
                str(tmp_path),
                "--lengths",
                "32",
                "64",
                "--chars",
                "3000",
                "--passkeys",
                "1",
                "--reselect-lengths",
                "3000",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    rows = list(csv.DictReader(open(tmp_path / "answer_length.csv")))
    speed = [r for r in rows if r["gen_length"]]
    assert [(r["gen_length"], r["block_cache"]) for r in speed] == [
        ("32", "off"), ("32", "block"), ("64", "off"), ("64", "block"),
    ]  # fmt: skip
    by = {(r["gen_length"], r["block_cache"]): r for r in speed}
    assert by[("64", "block")]["refreshes"] == "2" and by[("64", "off")]["refreshes"] == "0"
    assert int(by[("64", "block")]["nfe"]) == int(by[("64", "off")]["nfe"])  # a refresh is its step's forward
    report = (tmp_path / "answer_length.md").read_text()
    ratio = float(by[("64", "off")]["ms_per_step"]) / float(by[("64", "block")]["ms_per_step"])
    assert f"| {ratio:.2f}x |" in report
    assert "| 1 cases |" in report and "predicted ms/step" in report
    [resel] = [r for r in rows if r["context_tokens"]]
    assert int(resel["reselect_nfe"]) >= 2  # a draft and a scoring pass at least
    assert f"| {resel['context_tokens']} | {resel['chunks']} |" in report


def test_lengths_must_be_whole_blocks(tmp_path):
    with pytest.raises(SystemExit):
        answer_length.main(["--out", str(tmp_path), "--lengths", "48"])


def test_block_cached_flops_by_hand():
    a = flop_model.Arch.of(dream7b_config())
    # 64 answer tokens in blocks of 32, one token a step: 2 refreshes over the 48 + 64 live tokens, 62 steps of 33
    keys = 1000 + 48 + 64
    want = 2 * a.forward(112, keys, 32) + 62 * a.forward(33, keys, 32)
    assert flop_model.block_cached_decode_flops(a, 1000, 48, 64, 64, 32) == want
    # one block: the refresh then block-wide steps
    assert flop_model.block_cached_decode_flops(a, 0, 8, 32, 32, 32, shift=False) == a.forward(
        40, 40, 32
    ) + 31 * a.forward(32, 40, 32)
