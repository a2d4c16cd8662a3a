"""``draw_order="official"``: seeded sampled runs token-equal to the official Dream / LLaDA / Fast-dLLM loops
(re-stated in ``tests/official_loops_reference.py``) on tiny random checkpoints; the default order is not."""

import pytest
import torch

import dllm
from dllm.decode.unmasking import UnmaskingConfig
from tests.official_loops_reference import dream_official, dream_transfer_count, llada_official
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
    ("origin", {}),  # T = 0: only the positions are random
    ("origin", {"temperature": 0.7, "top_k": 50}),
    ("maskgit_plus", {"temperature": 0.7, "top_k": 50}),  # 3 of 32 runs equal in the batched order
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
    assert differs  # the default order draws otherwise


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


class _SharpModel(_Bf16Model):
    """:class:`_Bf16Model` with 30 times sharper logits, in ``dtype``, over up to ``positions`` positions: at
    T = 0.2 top-p 0.95 leaves one token per position, so every confidence of a step is the same number."""

    def __init__(self, family, dtype=torch.float32, positions=64):
        super().__init__(family)
        self.table = self.table * 30
        self.pos = torch.randn(positions, 40, generator=torch.Generator().manual_seed(4))
        self.out_dtype = dtype

    def __call__(self, x, pos, cache=None, **kw):
        from dllm.model.modeling import DecoderOutput

        return DecoderOutput(super().__call__(x, pos, cache, **kw).logits.float().to(self.out_dtype))


def _sharp_logits_of(model):
    return lambda x: model(x, torch.arange(x.shape[1])).logits  # noqa: E731


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dream_demo_settings_choose_tied_positions_as_the_official_loop(dtype):
    """Dream's demo settings (T = 0.2, top_p = 0.95, entropy, alg_temp 0): top-p leaves one token per position, every
    confidence ties, and Dream takes torch.topk over its [B, prompt + response] rows, which is not the leftmost:
    the official order chose the leftmost and matched in no run."""
    model = _SharpModel("dream", dtype)
    p = torch.randint(0, 30, (2, 5), generator=torch.Generator().manual_seed(1))
    kw = dict(temperature=0.2, top_p=0.95, alg_temp=0.0)
    from dllm.decode.unmasking import UnmaskingConfig, choose_tokens

    # the premise: at the first step top-p leaves one token at every masked position, so all confidences are equal
    first = _sharp_logits_of(model)(torch.cat([p, torch.full((2, 16), model.mask_token_id)], dim=1))[:, 5:]
    _, probs, _ = choose_tokens(first, UnmaskingConfig(temperature=0.2, top_p=0.95), mask_id=model.mask_token_id)
    assert bool((probs.amax(-1) == 1).all())
    differs = 0
    for seed in range(4):
        got = dllm.generate(model, p, gen_length=16, steps=8, alg="entropy", seed=seed, draw_order="official", **kw)
        torch.manual_seed(seed)
        want = dream_official(_sharp_logits_of(model), p, 16, 8, "entropy", model.mask_token_id, **kw)
        assert torch.equal(got.tokens, want), (seed, got.tokens, want)
        batched = dllm.generate(model, p, gen_length=16, steps=8, alg="entropy", seed=seed, **kw)
        differs += not torch.equal(batched.tokens, want)
    assert differs  # the batched order keeps its leftmost rule


class _TwoTokenModel(_Bf16Model):
    """Every position's logits: 0 at two tokens chosen by the position and the sequence's tokens, -inf elsewhere.
    Every distribution is (1/2, 1/2) exactly, in any dtype: every confidence of every rule ties, and which
    position is revealed changes the later tokens."""

    def __call__(self, x, pos, cache=None, *, logits_start=0, logits_at=None, **kw):
        from dllm.model.modeling import DecoderOutput

        b, n = x.shape
        key = (x.sum(dim=1, keepdim=True) + 7 * pos.reshape(-1, n)) % 37  # [B, n]
        logits = torch.full((b, n, 40), float("-inf"))
        logits.scatter_(2, torch.stack([key, (key + 1) % 37], dim=-1), 0.0)
        if logits_at is not None:
            return DecoderOutput(logits.gather(1, logits_at[..., None].expand(-1, -1, 40)))
        return DecoderOutput(logits[:, logits_start:])


@pytest.mark.parametrize(
    "alg,kw",
    [
        ("maskgit_plus", {}),
        ("topk_margin", {}),
        ("low_confidence", {"block_length": 8}),
        ("confidence_threshold", {"threshold": 0.9, "block_length": 8}),
    ],
)
def test_tied_confidences_go_where_the_official_topk_puts_them(alg, kw):
    """Greedy, every confidence equal: the official order reveals the positions of the official loops' torch.topk
    (Dream over the [B, L] rows, LLaDA and Fast-dLLM per row, Fast-dLLM's first pick when none reaches tau);
    the batched order keeps its leftmost rule."""
    kw = dict(kw)
    block = kw.pop("block_length", None)
    model = _TwoTokenModel("llada" if block else "dream")
    p = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(2))
    logits_of = _sharp_logits_of(model)
    got = dllm.generate(model, p, gen_length=16, steps=16, block_length=block, alg=alg, draw_order="official", **kw)
    if block:
        want = llada_official(logits_of, p, 16, 16, block, model.mask_token_id, threshold=kw.get("threshold"))
    else:
        want = dream_official(logits_of, p, 16, 16, alg, model.mask_token_id)
    assert torch.equal(got.tokens, want), (got.tokens, want)
    batched = dllm.generate(model, p, gen_length=16, steps=16, block_length=block, alg=alg, block_cache="off", **kw)
    assert not torch.equal(batched.tokens, want)


def _official_count(n, step, steps, eps):
    return dream_transfer_count(torch.ones(1, n, dtype=torch.bool), torch.linspace(1, eps, steps + 1), step, steps)


@pytest.mark.parametrize("steps,eps", [(8, 1e-3), (64, 1e-3), (512, 1e-3), (100, 1e-2), (1000, 1e-4)])
def test_dream_reveal_counts_are_the_official_float32_counts(steps, eps):
    """Dream's count int(n * (1 - s / t)) is float32 arithmetic (float32 tensors n, s, t); ours was float64 and
    differed by one at some steps from about 900 masks on. Every n of 1..4096, on the host (dream_count) and on
    the device (the count unmask_batch reveals, both draw orders)."""
    from dllm.decode.unmasking import _reveal_counts, dream_count

    n = torch.arange(1, 4097)
    cand = torch.arange(4096)[None, :] < n[:, None]  # row r: r + 1 candidates
    cfg = UnmaskingConfig(alg="entropy", eps=eps)
    ts = torch.linspace(1, eps, steps + 1)
    for step in sorted({0, 1, 4, steps // 3, steps // 2, steps - 3, steps - 2, steps - 1}):
        want = [dream_transfer_count(cand[r : r + 1, : r + 1], ts, step, steps) for r in range(4096)]
        assert _reveal_counts(cand, cfg, step, steps, None).tolist() == want, step
        assert [dream_count(m, step, steps, eps) for m in range(1, 4097)] == want, step


@pytest.mark.parametrize("draw_order", ["batched", "official"])
@pytest.mark.parametrize(
    "n,step,steps,want",
    [
        (933, 2, 934, 0),  # a 934-token answer at 934 steps, its third step: 933 masks, 1 revealed before
        (4004, 4, 8, 999),  # 998 before
    ],
)
def test_dream_step_reveals_the_official_count(n, step, steps, want, draw_order):
    from dllm.decode.unmasking import unmask_batch

    assert _official_count(n, step, steps, 1e-3) == want
    logits = torch.randn(1, n, 6, generator=torch.Generator().manual_seed(0))
    cfg = UnmaskingConfig(alg="maskgit_plus", draw_order=draw_order)
    got = unmask_batch(logits, torch.ones(1, n, dtype=torch.bool), cfg, step, steps, generator=torch.Generator())
    assert int(got.reveal.sum()) == want
