"""A prefix shared by batch rows is stored once in the static KV cache.

``StaticKVCache.from_rows`` gives one slot to each distinct ``Segment`` object; the batched prefill
hands the same prefix segment to every row with equal prefix ids, so 8 rows with one prefix hold one
prefix slot. Expected values are counted by hand (slots, table entries, pool bytes from the config's
widths), the attention over a shared table is compared with the same rows over an unshared table (bit
for bit) and with the naive reference, and every row of a batch equals its single run.
"""

import pytest
import torch

import dllm
from dllm.decode.timer import PhaseTimer
from dllm.model.kv_cache import Segment, StaticKVCache
from dllm.prefilling import PrefillingConfig, PromptParts, build_prefilling_policy
from tests.tiny_checkpoints import tiny_model_fixtures
from triton_kernels import reference as R
from triton_kernels import split_s_attention

BOS = 128  # DREAM_TINY bos_token_id
LAYERS, HKV, D = 2, 2, 16

dream, _llada = tiny_model_fixtures(dream_seed=41, llada_seed=42, llada_kv_heads=2)


def _seg(length, t, seed):
    g = torch.Generator().manual_seed(seed)
    k = [torch.randn(t, HKV, D, generator=g) for _ in range(LAYERS)]
    v = [torch.randn(t, HKV, D, generator=g) for _ in range(LAYERS)]
    return Segment(k, v, length)


def _rows_with_prefix(shared: bool):
    """8 rows: a 5-token prefix (one object, or 8 equal copies), then two own chunks of 3 and 4 tokens."""
    prefix = _seg(5, 5, seed=0)
    rows = []
    for b in range(8):
        pre = prefix if shared else Segment(list(prefix.k), list(prefix.v), prefix.length)
        rows.append([pre, _seg(3, 4, seed=10 + 2 * b), _seg(4, 4, seed=11 + 2 * b)])
    return rows


def test_from_rows_stores_a_shared_segment_once():
    cache = StaticKVCache.from_rows(_rows_with_prefix(shared=True))
    assert cache.num_slots == 1 + 8 * 2  # one prefix slot, two chunk slots per row
    slots = cache.seg_slots.tolist()
    assert [r[0] for r in slots] == [0] * 8  # every row names the prefix's slot
    own = [s for r in slots for s in r[1:]]
    assert sorted(own) == list(range(1, 17))  # the chunks keep distinct slots
    assert cache.seg_lens.tolist() == [[5, 3, 4]] * 8
    t = 5  # longest segment
    assert cache.nbytes() == 2 * LAYERS * 17 * t * HKV * D * 4
    assert cache.tokens_per_row().tolist() == [12] * 8


def test_distinct_segment_objects_keep_their_slots():
    """Equal values in different objects (e.g. rows whose prefixes differ in fact) are not merged."""
    cache = StaticKVCache.from_rows(_rows_with_prefix(shared=False))
    assert cache.num_slots == 8 * 3
    assert cache.seg_slots.tolist() == [[3 * b, 3 * b + 1, 3 * b + 2] for b in range(8)]
    assert cache.nbytes() == 2 * LAYERS * 24 * 5 * HKV * D * 4


def test_a_segment_named_twice_in_one_row_has_one_slot():
    a, c = _seg(2, 3, 1), _seg(3, 3, 2)
    cache = StaticKVCache.from_rows([[a, c, a], [c]])
    assert cache.num_slots == 2
    assert cache.seg_slots.tolist() == [[0, 1, 0], [1, -1, -1]]


@pytest.mark.parametrize("live_lens", [None, [6, 4, 6, 5, 6, 3, 6, 6]])
def test_attention_over_a_shared_slot_equals_the_unshared_table(live_lens):
    """The CPU path (one fused call per row shape) reads a slot named by 8 rows; each row's out/lse are
    the bits of the same rows over a table where every row has its own copy, and match the reference;
    so does the Triton kernel (run by its interpreter here)."""
    shared = StaticKVCache.from_rows(_rows_with_prefix(shared=True))
    copied = StaticKVCache.from_rows(_rows_with_prefix(shared=False))
    g = torch.Generator().manual_seed(5)
    q = torch.randn(8, 6, 4 * HKV, D, generator=g)
    k_live, v_live = torch.randn(8, 6, HKV, D, generator=g), torch.randn(8, 6, HKV, D, generator=g)
    ll = None if live_lens is None else torch.tensor(live_lens, dtype=torch.int32)
    for layer in range(LAYERS):
        args = (q, shared.k[layer], shared.v[layer], shared.seg_slots, shared.seg_lens, k_live, v_live)
        out, lse = split_s_attention(*args, live_lens=ll, backend="torch")
        args_c = (q, copied.k[layer], copied.v[layer], copied.seg_slots, copied.seg_lens, k_live, v_live)
        out_c, lse_c = split_s_attention(*args_c, live_lens=ll, backend="torch")
        assert torch.equal(out, out_c) and torch.equal(lse, lse_c)
        ref_out, ref_lse = R.split_s_attention(*args, live_lens=ll)
        ok = torch.isfinite(ref_lse)
        assert torch.equal(ok, torch.isfinite(lse))
        assert (out - ref_out).abs().max().item() < 1e-5
        assert (lse[ok] - ref_lse[ok]).abs().max().item() < 1e-5
        # the Triton kernel (interpreted on CPU) reads the shared slot through the same table
        out_t, lse_t = split_s_attention(*args, live_lens=ll, backend="triton")
        assert torch.equal(torch.isfinite(lse_t), ok)
        assert (out_t - ref_out).abs().max().item() < 1e-4
        assert (lse_t[ok] - ref_lse[ok]).abs().max().item() < 1e-4


def _prompts(same_prefix: bool, n=8):
    g = torch.Generator().manual_seed(7)
    r = lambda k: torch.randint(0, 120, (k,), generator=g)
    prefix = torch.cat([torch.tensor([BOS]), r(6)])
    rows = []
    for b in range(n):
        pre = prefix if same_prefix else torch.cat([torch.tensor([BOS]), r(6)])
        rows.append(PromptParts(pre.clone(), r(20 + 3 * b), r(4 + b % 3)))
    return rows


@pytest.mark.parametrize("same_prefix", [True, False])
def test_batched_prefill_shares_the_prefix_slot_and_rows_equal_single_runs(dream, same_prefix):
    rows = _prompts(same_prefix)
    cfg = PrefillingConfig(chunk_size=8, top_k=2)
    setup = build_prefilling_policy(dream, None, rows, cfg, PhaseTimer("cpu"), gen_length=4)
    cache = setup.cache
    prefix_slots = 1 if same_prefix else 8
    assert cache.num_slots == prefix_slots + 8 * 2
    col0 = cache.seg_slots[:, 0].tolist()
    assert len(set(col0)) == prefix_slots
    cfg_m = dream.config
    t = cfg.chunk_size + 1  # a kept chunk (BOS anchor + 8 tokens) is longer than the 7-token prefix
    want = 2 * cfg_m.num_layers * cache.num_slots * t * cfg_m.num_kv_heads * cfg_m.head_dim * 4
    assert cache.k[0].dtype == torch.float32 and cache.nbytes() == want
    kw = dict(prefilling=cfg, gen_length=4, steps=4)
    batch = dllm.generate(dream, method="prefilling", prompt=rows, **kw)
    for i, parts in enumerate(rows):
        alone = dllm.generate(dream, method="prefilling", prompt=parts, **kw)
        assert torch.equal(batch.tokens[i], alone.tokens[0]), f"row {i}"
        assert batch.stats.rows[i]["cached_tokens"] == alone.stats.extra["cached_tokens"]
