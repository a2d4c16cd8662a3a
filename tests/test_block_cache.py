"""Block-cached decoding (:mod:`dllm.decode.block_cache`): a step recomputes the current block only.

Three kinds of evidence. (1) Refreshed at every step (``block_cache="step"``) the cached path must give the tokens
of recomputing everything (``"off"``), for every method, both logit conventions, ragged batches and a
``DocumentCache``, on the torch path and on the Triton kernels. (2) Between refreshes a step's logits must equal an
independent reference: a plain forward over the whole live block in which every layer's K/V outside the block
(and outside the column before it, for a shifted model) are overwritten with those of the refresh, i.e. exactly
the staleness the method allows and nothing else. (3) The schedule: refresh counts, forwards, fixed buffers.
"""

import pytest
import torch

import dllm
from dllm.decode.block_cache import BlockCache, check_block_cache
from dllm.decode.policies import DensePolicy
from dllm.decode.timer import PhaseTimer
from dllm.prefilling import PrefillingConfig, PromptParts, build_prefilling_policy
from tests.tiny_checkpoints import LLADA_BOS, small_model, tiny_model_fixtures

BOS = 128  # DREAM_TINY bos_token_id

dream, llada = tiny_model_fixtures(dream_seed=51, llada_seed=52, llada_kv_heads=2)


pytestmark = pytest.mark.usefixtures("one_thread")


def _ids(n, seed, vocab=90):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _parts(model, shapes=((6, 45, 6), (4, 21, 9)), seed=0):
    bos = BOS if model.family == "dream" else LLADA_BOS
    rows = []
    for i, (n_pre, n_ctx, n_q) in enumerate(shapes):
        prefix = torch.cat([torch.tensor([bos]), _ids(n_pre - 1, seed + 3 * i)])
        rows.append(PromptParts(prefix, _ids(n_ctx, seed + 3 * i + 1), _ids(n_q, seed + 3 * i + 2)))
    return rows


CFG = PrefillingConfig(chunk_size=8, top_k=2)
GEN = dict(gen_length=12, steps=12, block_length=4)


def _run(model, method, mode, **kw):
    args = {**GEN, **kw}
    if method == "prefilling":
        args.setdefault("prompt", _parts(model)[0])
        args.setdefault("prefilling", CFG)
    else:
        args["input_ids"] = _ids(19, 7)[None].repeat(2, 1)
        args["input_ids"][1, :5] = _ids(5, 8)
    return dllm.generate(model, method=method, block_cache=mode, **args)


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("method", ["dense", "prefix_cache", "prefilling"])
def test_refreshed_every_step_equals_recomputing_everything(family, method, dream, llada):
    model = dream if family == "dream" else llada
    kw = {"alg": "low_confidence"} if family == "llada" else {}
    off = _run(model, method, "off", **kw)
    step = _run(model, method, "step", **kw)
    assert torch.equal(step.tokens, off.tokens)
    assert (off.tokens != model.mask_token_id).all()
    # every step: one refresh forward over the live block, then the block-only forward
    assert step.stats.extra["block_cache_refreshes"] == step.stats.steps == 12
    assert step.stats.nfe - off.stats.nfe == 12
    assert off.stats.extra["block_cache"] == "off" and "block_cache_refreshes" not in off.stats.extra


def test_ragged_batch_and_document_refreshed_every_step_equal_recomputing(dream, tmp_path):
    rows = _parts(dream, shapes=((6, 45, 6), (4, 21, 9), (3, 30, 2)))
    off = _run(dream, "prefilling", "off", prompt=rows)
    step = _run(dream, "prefilling", "step", prompt=rows)
    assert torch.equal(step.tokens, off.tokens)
    doc = dllm.encode_document(dream, rows[0].context, prefilling=CFG)
    asked = PromptParts(rows[0].prefix, None, rows[0].query)
    from_doc = _run(dream, "prefilling", "step", prompt=asked, document=doc)
    assert torch.equal(from_doc.tokens[0], off.tokens[0])


def _frozen_reference(model, ids, positions, cache, stale_k, stale_v, fresh_cols, logit_cols):
    """Logits of a plain forward over the whole live block whose K/V outside ``fresh_cols`` are, in every
    layer, the stale ones of the refresh: what a block-cached step must compute."""
    stale = torch.ones(ids.shape[1], dtype=torch.bool)
    stale[fresh_cols] = False

    def freeze(layer, q, k, v):
        k[:, stale] = stale_k[layer][:, stale]
        v[:, stale] = stale_v[layer][:, stale]

    return model(ids, positions, cache, logits_at=logit_cols, attn_hook=freeze).logits


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("method", ["dense", "prefilling"])
def test_a_step_between_refreshes_equals_a_forward_with_stale_kv_outside_the_block(family, method, dream, llada):
    model = dream if family == "dream" else llada
    block, width = slice(4, 8), 4
    if method == "dense":
        prompt = _ids(15, 3)[None]
        policy = DensePolicy(model, prompt, 12)
        head, start, cache = prompt[0], 0, None
    else:
        parts = _parts(model)[0]
        setup = build_prefilling_policy(model, None, parts, CFG, PhaseTimer("cpu"), gen_length=12)
        policy, head, start, cache = setup.policy, parts.query, setup.row.query_start, setup.cache
    policy.use_block_cache(width, "block")
    mask = model.mask_token_id
    resp0 = torch.full((1, 12), mask)
    resp0[0, :4] = _ids(4, 11)  # the first block is done
    resp1 = resp0.clone()
    resp1[0, 5], resp1[0, 7] = 17, 23  # two tokens of the block revealed since the refresh
    with torch.no_grad():
        policy.prepare(resp0, block, 0)
        policy.logits(resp0)  # the refresh
        ids0 = torch.cat([head, resp0[0]])[None]
        pos = torch.arange(start, start + ids0.shape[1])
        stale = model(ids0, pos, cache, return_kv=True)
        policy.prepare(resp1, block, 1)
        got = policy.logits(resp1)
        h = head.numel()
        fresh = torch.arange(h + block.start - int(model.shift_logits), h + block.stop)
        ids1 = torch.cat([head, resp1[0]])[None]
        want = _frozen_reference(model, ids1, pos, cache, stale.k, stale.v, fresh, (h + torch.arange(4, 8))[None])
        exact = model(ids1, pos, cache, logits_at=(h + torch.arange(4, 8))[None]).logits
    assert got.shape == want.shape == (1, width, model.config.vocab_size)
    assert (got - want).abs().max().item() < 1e-5
    # and the staleness is real: the exact step differs (else this test could not tell the two apart)
    assert (got - exact).abs().max().item() > 1e-4


def test_schedule_counts_refreshes_and_keeps_its_buffers(dream):
    block = _run(dream, "dense", "block")
    every2 = _run(dream, "dense", 2)
    assert block.stats.extra["block_cache"] == "block" and block.stats.extra["block_cache_refreshes"] == 3
    assert every2.stats.extra["block_cache_refreshes"] == 6  # steps 0 and 2 of each 4-step block
    assert block.stats.nfe == every2.stats.nfe == 12  # a refresh's logits are its step's: no extra forward
    # bytes: layers x 2 (K, V) x rows x slots x T x Hkv x D x 4 (fp32), the live block 19 + 12 columns in one slot
    cfg = dream.config
    assert block.stats.extra["block_cache_bytes"] == cfg.num_layers * 2 * 2 * 31 * cfg.num_kv_heads * cfg.head_dim * 4
    # the default: on when the answer has several blocks, off for one block
    auto = _run(dream, "dense", None)
    assert auto.stats.extra["block_cache"] == "block" and torch.equal(auto.tokens, block.tokens)
    one = _run(dream, "dense", None, block_length=12)
    assert one.stats.extra["block_cache"] == "off"


def test_pools_and_step_buffers_stay_put_over_a_generation(dream):
    """A CUDA graph replays the step over fixed addresses: nothing the step reads is reallocated."""
    setup = build_prefilling_policy(dream, None, _parts(dream)[1], CFG, PhaseTimer("cpu"), gen_length=12)
    policy = setup.policy
    policy.use_block_cache(4, "block")
    seen = set()
    resp = torch.full((1, 12), dream.mask_token_id)
    with torch.no_grad():
        for b in range(3):
            for step in range(4):
                policy.prepare(resp, slice(4 * b, 4 * b + 4), step)
                policy.logits(resp)
                resp[0, 4 * b + step] = 5
                bc = policy.block_cache
                seen.add((bc.cols.data_ptr(), bc.step_cache.k[0].data_ptr(), bc.step_cache.seg_slots.data_ptr()))
    assert len(seen) == 1 and policy.block_cache.refreshes == 3


def test_kernels_path_refreshed_every_step_equals_recomputing(dream, monkeypatch):
    from triton_kernels._dispatch import is_interpreted
    from triton_kernels.split_s import _split_s_partial_kernel

    if not torch.cuda.is_available() and not is_interpreted(_split_s_partial_kernel):
        pytest.skip("the Triton kernels on CPU need the Triton interpreter")
    # the kernels need a head dim that is a multiple of 16; the fused elementwise path (one q/k/v GEMM whose
    # k and v are strided views) writes into the pools too
    model = small_model(
        "dream", vocab_size=160, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=2, num_kv_heads=1,
        head_dim=16, mask_token_id=159, bos_token_id=BOS,
    )  # fmt: skip
    model.fused_ops = True
    monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "triton")
    kw = dict(gen_length=8, steps=8, block_length=4, prompt=_parts(model, shapes=((3, 20, 3),))[0])
    off = _run(model, "prefilling", "off", **kw)
    step = _run(model, "prefilling", "step", **kw)
    assert torch.equal(step.tokens, off.tokens)
    assert step.stats.extra["block_cache_refreshes"] == 8


@pytest.mark.parametrize(
    "value, error",
    [("blocks", ValueError), (0, ValueError), (-3, ValueError), (True, TypeError), (1.5, TypeError), ([], TypeError)],
)
def test_bad_block_cache_values(value, error, dream):
    with pytest.raises(error, match="block_cache"):
        check_block_cache(value, 8, 4)
    with pytest.raises(error, match="block_cache"):
        dllm.generate(dream, _ids(5, 0)[None], gen_length=8, block_length=4, block_cache=value)
    with pytest.raises(ValueError, match="refresh"):
        BlockCache(dream, None, 4, "off")
