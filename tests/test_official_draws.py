"""``draw_order="official"``: seeded sampled runs token-equal to the official Dream / LLaDA / Fast-dLLM loops
(re-stated in ``tests/official_loops_reference.py``) on tiny random checkpoints; the default order is not."""

import pytest
import torch

import dllm
from dllm.decode.unmasking import UnmaskingConfig
from tests.official_loops_reference import dream_official, llada_official
from tests.tiny_checkpoints import tiny_model_fixtures

dream, llada = tiny_model_fixtures(dream_seed=11, llada_seed=12, llada_kv_heads=3)


def _prompt(model, b=2, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size - 5, (b, n), generator=g)


def _logits_of(model):
    def logits_of(x):
        return model(x, torch.arange(x.shape[1]), logits_start=0).logits.float()

    return logits_of


DREAM_CASES = [
    ("origin", {}),  # the case: T = 0, only the positions are random
    ("origin", {"temperature": 0.7, "top_k": 50}),
    ("maskgit_plus", {"temperature": 0.7, "top_k": 50}),  # the case: 3/32 equal in the batched order
    ("topk_margin", {"temperature": 1.0, "top_p": 0.9}),
    ("entropy", {"temperature": 0.5, "alg_temp": 0.3}),
    ("maskgit_plus", {"alg_temp": 0.2}),  # greedy tokens, sampled positions
]


@pytest.mark.parametrize("alg,kw", DREAM_CASES)
def test_dream_rules_equal_the_official_loop(dream, alg, kw):
    p = _prompt(dream)
    differs = 0
    for seed in range(3):
        got = dllm.generate(dream, p, gen_length=12, steps=6, alg=alg, seed=seed, draw_order="official", **kw)
        torch.manual_seed(seed)
        want = dream_official(_logits_of(dream), p, 12, 6, alg, dream.mask_token_id, **kw)
        assert torch.equal(got.tokens, want), (seed, got.tokens, want)
        batched = dllm.generate(dream, p, gen_length=12, steps=6, alg=alg, seed=seed, **kw)
        differs += not torch.equal(batched.tokens, want)
    assert differs  # the default order draws otherwise (what the issue measured)


LLADA_CASES = [
    ("low_confidence", {"temperature": 0.7}, 4, 8),
    ("low_confidence", {"temperature": 1.0}, 4, 12),  # 6 steps per block of 4: the official loop draws at all 6
    ("random", {}, 8, 4),
    ("random", {"temperature": 0.5}, 4, 8),
    ("confidence_threshold", {"temperature": 0.6, "threshold": 0.05}, 4, 8),
]


@pytest.mark.parametrize("alg,kw,block,steps", LLADA_CASES)
def test_llada_rules_equal_the_official_loops(llada, alg, kw, block, steps):
    p = _prompt(llada, n=5)
    remasking = "random" if alg == "random" else "low_confidence"
    ref = dict(temperature=kw.get("temperature", 0.0), remasking=remasking, threshold=kw.get("threshold"))
    if alg != "confidence_threshold":
        ref["threshold"] = None
    differs = 0
    for seed in range(3):
        got = dllm.generate(
            llada, p, gen_length=8, steps=steps, block_length=block, alg=alg, seed=seed, draw_order="official", **kw
        )
        torch.manual_seed(seed)
        want = llada_official(_logits_of(llada), p, 8, steps, block, llada.mask_token_id, **ref)
        assert torch.equal(got.tokens, want), (seed, got.tokens, want)
        batched = dllm.generate(llada, p, gen_length=8, steps=steps, block_length=block, alg=alg, seed=seed, **kw)
        differs += not torch.equal(batched.tokens, want)
    assert differs


def test_official_order_with_the_prefix_cache_policy(llada):
    """The draws cover prompt + response whatever the policy: prefix_cache rebuilt every step (dense logits)
    gives the official tokens too."""
    p = _prompt(llada, n=6)
    kw = dict(gen_length=8, steps=8, block_length=4, alg="low_confidence", temperature=0.8, seed=5)
    got = dllm.generate(llada, p, method="prefix_cache", cache_refresh="step", draw_order="official", **kw)
    torch.manual_seed(5)
    want = llada_official(_logits_of(llada), p, 8, 8, 4, llada.mask_token_id, temperature=0.8)
    assert torch.equal(got.tokens, want)


def test_draw_order_is_checked():
    with pytest.raises(ValueError, match="draw_order must be one of \\('batched', 'official'\\)"):
        UnmaskingConfig(draw_order="reference")
    assert UnmaskingConfig().draw_order == "batched"


class _Bf16Model:
    """A bf16 stand-in model: logits mix each token's row of a random table with the sequence's mean row and a
    position row (no attention; enough to make every step's logits depend on the tokens revealed so far)."""

    config = type("Cfg", (), {"vocab_size": 40, "eos_token_id": 38, "pad_token_id": 38})()
    device = torch.device("cpu")
    tokenizer = None
    mask_token_id = 39

    def __init__(self, family):
        self.family = family
        g = torch.Generator().manual_seed(3)
        self.table = torch.randn(40, 40, generator=g) * 2
        self.pos = torch.randn(64, 40, generator=g)

    def __call__(self, x, pos, cache=None, *, logits_start=0, logits_at=None, **kw):
        from dllm.model.modeling import DecoderOutput

        rows = self.table[x]
        logits = rows + 0.5 * rows.mean(dim=1, keepdim=True) + self.pos[pos].expand_as(rows)
        if logits_at is not None:  # a semi-autoregressive block's columns only
            return DecoderOutput(logits.gather(1, logits_at[..., None].expand(-1, -1, logits.shape[-1])).bfloat16())
        return DecoderOutput(logits[:, logits_start:].to(torch.bfloat16))


@pytest.mark.parametrize(
    "alg,kw",
    [
        ("maskgit_plus", {"temperature": 0.9}),
        ("entropy", {"temperature": 0.6, "alg_temp": 0.5, "top_p": 0.95}),
        ("low_confidence", {"temperature": 0.8, "block_length": 4}),
        ("confidence_threshold", {"temperature": 0.8, "threshold": 0.3, "block_length": 4}),
    ],
)
def test_official_order_computes_in_the_references_dtypes(alg, kw):
    """Dream samples in the logits' dtype (bf16 here), LLaDA ranks by a bf16 softmax, Fast-dLLM by a float64 one."""
    kw = dict(kw)
    block = kw.pop("block_length", None)
    model = _Bf16Model("llada" if block else "dream")
    p = torch.randint(0, 30, (2, 5), generator=torch.Generator().manual_seed(1))
    for seed in range(3):
        got = dllm.generate(
            model, p, gen_length=8, steps=8, block_length=block, alg=alg, seed=seed, draw_order="official", **kw
        )
        torch.manual_seed(seed)
        logits_of = lambda x: model(x, torch.arange(x.shape[1])).logits  # noqa: E731
        if block:
            ref = dict(temperature=kw["temperature"], threshold=kw.get("threshold"))
            want = llada_official(logits_of, p, 8, 8, block, model.mask_token_id, **ref)
        else:
            want = dream_official(logits_of, p, 8, 8, alg, model.mask_token_id, **kw)
        assert torch.equal(got.tokens, want), (seed, got.tokens, want)


def test_cli_draw_order_reaches_generate():
    """``--draw-order`` (generate and eval) becomes ``generate``'s ``draw_order``; the default is batched."""
    from dllm.cli.options import decode_kwargs
    from dllm.cli.parser import build_parser

    parser = build_parser()
    for cmd in (["generate"], ["eval", "needle"]):
        args = parser.parse_args([*cmd, "--gen-length", "8", "--draw-order", "official"])
        assert decode_kwargs(args, 8)["draw_order"] == "official"
        assert decode_kwargs(parser.parse_args([*cmd, "--gen-length", "8"]), 8)["draw_order"] == "batched"


def test_official_alg_temp_reveals_only_candidates_when_weights_underflow():
    """softmax(conf / alg_temp) can underflow to 0 for all but one position; torch.multinomial then returns
    zero-weight columns (prompt positions, revealed tokens), which must never be revealed."""
    from dllm.decode.unmasking import unmask_batch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 9, generator=g) * 4
    cand = torch.tensor([[True, False, True, True, False, True], [False, True, True, False, True, True]])
    cfg = UnmaskingConfig(alg="entropy", alg_temp=1e-4, draw_order="official")
    for seed in range(5):
        got = unmask_batch(logits, cand, cfg, 3, 4, generator=torch.Generator().manual_seed(seed), seq_span=(7, 13))
        assert not (got.reveal & ~cand).any()
        best = torch.where(cand, (lambda p: (p * (p + 1e-10).log()).sum(-1))(logits.softmax(-1)), -torch.inf)
        assert got.reveal.gather(1, best.argmax(1, keepdim=True)).all()  # the one position with weight
