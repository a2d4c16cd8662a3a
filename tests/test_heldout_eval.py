"""bench.fidelity.heldout_eval's grid and its lexical probe: what the recorded evaluation asks."""

import torch

from bench.fidelity.heldout_eval import DEPTHS, lexical_overlap, reports


def test_grid_single_needles_short_three_needles_long():
    docs = reports([4096, 65536], seeds=1, multi_from=65536)
    short = [d for d in docs if d.length == 4096]
    assert len(short) == 15 and all(len(d.needles) == 1 for d in short)
    assert sorted((d.needles[0].task, d.needles[0].depth) for d in short) == sorted(
        (t, x) for t in ("passkey", "number_string", "word_fact") for x in DEPTHS
    )
    long = [d for d in docs if d.length == 65536]
    assert len(long) == 3 and all(len(d.needles) == 3 for d in long)
    for task in ("passkey", "number_string", "word_fact"):  # each task at three depths over the three documents
        assert len({n.depth for d in long for n in d.needles if n.task == task}) == 3
    for d in long:  # the needles of one document are >= 20% of it apart, so a 1K crop holds one
        starts = sorted(n.start for n in d.needles)
        assert min(b - a for a, b in zip(starts, starts[1:])) > 0.15 * len(d.context)


class _Chunks:
    def __init__(self, texts):
        self.ids = [torch.tensor([ord(c) for c in t]) for t in texts]
        self.num_chunks = len(texts)

    def context_ids(self, j):
        return self.ids[j]


def test_lexical_overlap_is_the_share_of_query_4grams_in_the_chunk():
    query = torch.tensor([ord(c) for c in "pass key"])  # 4-grams: "pass", "ass ", "ss k", "s ke", " key"
    chunks = _Chunks(["The pass key is 12345.", "a passage", "nothing here"])
    got = lexical_overlap(query, chunks).tolist()
    assert got == [1.0, torch.tensor(1 / 5).item(), 0.0]  # "a passage" holds only "pass" (fp32)
