"""Unmasking rules on a stub model with fixed logits, against hand-computed orders."""

import math

import pytest
import torch

import dllm
from dllm.decode.unmasking import UnmaskingConfig, dream_count, llada_schedule, most_confident
from dllm.model.modeling import DecoderOutput

# Response position -> probabilities over the 3 real tokens (token 3 = mask, 4 = eos: prob 0).
#            top1  argmax  margin  sum p log p
# pos0 A  .46   tok 1   .02     -0.949
# pos1 B  .50   tok 2   .25     -1.040
# pos2 C  .70   tok 0   .55     -0.819
# pos3 D  .60   tok 1   .22     -0.752
PROBS = [[0.44, 0.46, 0.10], [0.25, 0.25, 0.50], [0.70, 0.15, 0.15], [0.38, 0.60, 0.02]]
ARGMAX = [1, 2, 0, 1]
MASK = 3


class _Cfg:
    vocab_size = 5
    eos_token_id = 4
    pad_token_id = 4


class StubModel:
    """Fixed logits per response position; records the response seen at every forward."""

    family = "dream"
    mask_token_id = MASK
    config = _Cfg()
    device = torch.device("cpu")
    tokenizer = None

    def __init__(self, family="dream"):
        self.family = family
        self.history = []
        logp = torch.full((4, 5), -math.inf)
        logp[:, :3] = torch.tensor(PROBS).log()
        self.logp = logp

    def __call__(self, x, pos, cache=None, *, logits_start=0, logits_at=None, return_kv=False, **kw):
        if logits_at is not None:  # a semi-autoregressive block's columns (the response is the last 4)
            start = x.shape[1] - self.logp.shape[0]
            self.history.append(x[0, start:].tolist())
            return DecoderOutput(self.logp[logits_at - start].clone())
        self.history.append(x[0, logits_start:].tolist())
        g = x.shape[1] - logits_start
        return DecoderOutput(self.logp[:g].unsqueeze(0).expand(x.shape[0], g, 5).clone())


def reveal_order(history):
    """List of sets: positions revealed before each forward after the first, plus the final state."""
    order = []
    for prev, cur in zip(history, history[1:]):
        order.append({i for i, (a, b) in enumerate(zip(prev, cur)) if a == MASK and b != MASK})
    return order


def run(alg, steps=4, block_length=None, family="dream", **kw):
    m = StubModel(family)
    kw.setdefault("block_cache", "off")  # the stub's logits are fixed per position: the rule's order is tested
    res = dllm.generate(
        m, torch.tensor([[0, 1, 2]]), gen_length=4, steps=steps, block_length=block_length, alg=alg, **kw
    )
    final = res.tokens[0].tolist()
    m.history.append(final)
    return reveal_order(m.history), final, res


def test_schedules_by_hand():
    # Dream linear schedule, 4 masks, 4 steps, eps=1e-3: t = 1, .75025, .5005, .25075
    # step0: int(4 * (1 - .75025/1)) = int(0.999) = 0; step1: int(4 * (1 - .5005/.75025)) = int(1.33) = 1
    assert dream_count(4, 0, 4, 1e-3) == 0
    assert dream_count(4, 1, 4, 1e-3) == 1
    assert dream_count(3, 2, 4, 1e-3) == 1  # int(3 * (1 - .25075/.5005)) = int(1.497)
    assert dream_count(2, 3, 4, 1e-3) == 2  # last step: everything left
    assert llada_schedule(10, 4) == [3, 3, 2, 2]
    assert llada_schedule(2, 4) == [1, 1, 0, 0]


def test_maskgit_plus_order():
    # counts [0, 1, 1, 2]; by top1: C(2) .70 > D(3) .60 > B(1) .50 > A(0) .46
    order, final, res = run("maskgit_plus")
    assert order == [set(), {2}, {3}, {0, 1}]
    assert final == ARGMAX
    assert res.stats.nfe == 4 and res.stats.steps == 4


def test_topk_margin_order():
    # by margin: C .55 > B .25 > D .22 > A .02
    order, final, _ = run("topk_margin")
    assert order == [set(), {2}, {1}, {0, 3}]
    assert final == ARGMAX


def test_entropy_order():
    # by sum p log p: D -.752 > C -.819 > A -.949 > B -1.040
    order, final, _ = run("entropy")
    assert order == [set(), {3}, {2}, {0, 1}]


def test_low_confidence_order():
    # LLaDA: one token per step by top1 probability: C, D, B, A
    order, final, _ = run("low_confidence", family="llada")
    assert order == [{2}, {3}, {1}, {0}]
    assert final == ARGMAX


def test_semi_autoregressive_blocks():
    # blocks of 2, 2 steps each: block 0 = {A, B}: B (.50) then A (.46); block 1: C then D
    order, _, _ = run("low_confidence", steps=4, block_length=2, family="llada")
    assert order == [{1}, {0}, {2}, {3}]


def test_confidence_threshold():
    # tau .65: step0 only C >= .65; then none -> the single best: D, then B, then A
    order, final, res = run("confidence_threshold", threshold=0.65)
    assert order == [{2}, {3}, {1}, {0}]
    assert res.stats.nfe == 4
    # tau .45: every top1 >= .45 -> all four in one step
    order, final, res = run("confidence_threshold", threshold=0.45)
    assert order == [{0, 1, 2, 3}] and res.stats.nfe == 1 and final == ARGMAX


def test_origin_last_step_reveals_all_and_seed_reproducible():
    order, final, _ = run("origin", steps=1, seed=0)
    assert order == [{0, 1, 2, 3}] and final == ARGMAX
    a = run("origin", steps=4, seed=123)[0]
    b = run("origin", steps=4, seed=123)[0]
    assert a == b
    assert set().union(*a) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    "alg,kw",
    [
        ("random", {}),
        ("maskgit_plus", {"alg_temp": 0.5}),
        ("maskgit_plus", {"temperature": 1.0}),
        ("low_confidence", {"temperature": 0.7}),
    ],
)
def test_same_seed_same_output(alg, kw):
    fam = "llada" if alg in ("random", "low_confidence") else "dream"
    outs = [run(alg, family=fam, seed=7, **kw)[:2] for _ in range(2)]
    assert outs[0] == outs[1]
    many = {str(run(alg, family=fam, seed=s, **kw)[:2]) for s in range(12)}
    assert len(many) > 1, "different seeds never changed the result"


def test_tie_rule_is_leftmost_first():
    conf = torch.tensor([0.5, 0.9, 0.9, 0.1, 0.9])
    assert most_confident(conf, 2).tolist() == [1, 2]
    assert most_confident(conf, 4).tolist() == [1, 2, 4, 0]
    assert most_confident(torch.ones(6), 3).tolist() == [0, 1, 2]
    # many equal values: torch.topk does not promise which ones it returns; the rule does
    assert most_confident(torch.ones(1000), 5).tolist() == [0, 1, 2, 3, 4]


# At T = 1e-3 the tempered distribution of every position is one-hot in fp32 (the runner-up is
# at least exp(-0.044 / 1e-3) = 8e-20 of the top: A's .46 vs .44), so every tempered confidence
# is exactly 1.0 and the tie rule orders the reveals; the untempered confidence keeps the table's order.
COLD = 1e-3


@pytest.mark.parametrize(
    "alg,family,tempered_order,logits_order",
    [
        # Dream counts [0, 1, 1, 2]; untempered top1 order C > D > B > A
        ("maskgit_plus", "dream", [set(), {0}, {1}, {2, 3}], [set(), {2}, {3}, {0, 1}]),
        # untempered margins C > B > D > A; tempered margins all 1 - 0
        ("topk_margin", "dream", [set(), {0}, {1}, {2, 3}], [set(), {2}, {1}, {0, 3}]),
        # LLaDA: one per step
        ("low_confidence", "llada", [{0}, {1}, {2}, {3}], [{2}, {3}, {1}, {0}]),
    ],
)
def test_confidence_from_at_low_temperature(alg, family, tempered_order, logits_order):
    for source, want in (("tempered", tempered_order), ("logits", logits_order)):
        order, final, _ = run(alg, family=family, seed=0, temperature=COLD, confidence_from=source)
        assert order == want, source
        assert final == ARGMAX  # the tokens are drawn from the tempered distribution either way


def test_confidence_from_defaults_follow_each_reference():
    # Dream's reference ranks by the tempered distribution; LLaDA's and Fast-dLLM's by softmax(logits)
    for alg in ("origin", "maskgit_plus", "topk_margin", "entropy"):
        assert UnmaskingConfig(alg=alg).confidence_from == "tempered"
    for alg in ("low_confidence", "random", "confidence_threshold"):
        assert UnmaskingConfig(alg=alg).confidence_from == "logits"
    assert run("maskgit_plus", temperature=COLD, seed=0)[0] == [set(), {0}, {1}, {2, 3}]
    assert run("low_confidence", family="llada", temperature=COLD, seed=0)[0] == [{2}, {3}, {1}, {0}]
    with pytest.raises(ValueError, match="confidence_from"):
        UnmaskingConfig(confidence_from="probs")


def test_confidence_threshold_at_low_temperature():
    # untempered (the default): tau .65 keeps the greedy order of test_confidence_threshold
    order, _, _ = run("confidence_threshold", threshold=0.65, temperature=COLD, seed=0)
    assert order == [{2}, {3}, {1}, {0}]
    # tempered: every slot reports 1.0 >= tau, so the whole block is revealed in one step
    order, final, res = run(
        "confidence_threshold", threshold=0.65, temperature=COLD, seed=0, confidence_from="tempered"
    )
    assert order == [{0, 1, 2, 3}] and res.stats.nfe == 1 and final == ARGMAX


def test_random_follows_llada_schedule():
    order, _, _ = run("random", family="llada", seed=3)
    assert [len(s) for s in order] == [1, 1, 1, 1]


def test_bad_generate_arguments():
    m = StubModel()
    p = torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match="multiple of block_length"):
        dllm.generate(m, p, gen_length=4, block_length=3)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        dllm.generate(m, p, gen_length=4, steps=0)
    with pytest.raises(ValueError, match="multiple of the number of blocks"):
        dllm.generate(m, p, gen_length=4, block_length=2, steps=3)
    with pytest.raises(ValueError, match="mask token"):
        dllm.generate(m, torch.tensor([[0, MASK, 1]]), gen_length=4)
    with pytest.raises(ValueError, match="unknown method"):
        dllm.generate(m, p, method="magic")
    with pytest.raises(ValueError, match="unknown unmasking alg"):
        dllm.generate(m, p, alg="greedy")
    with pytest.raises(TypeError, match="int64"):
        dllm.generate(m, p.float())
    with pytest.raises(ValueError, match="non-empty"):
        dllm.generate(m, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="vocabulary|\\[0, 5\\)"):
        dllm.generate(m, torch.tensor([[0, 9]]))


# --- the batched step against main's per-row step -------------------------------------------------


def _random_case(seed, b=3, n=9, v=13, saturate=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, n, v, generator=g) * 2.5
    if saturate:  # equal confidences: the tie rule decides
        logits[:, :, 0] = 40.0
    cand = torch.rand(b, n, generator=g) < 0.7
    cand[0] = True
    cand[-1] = False  # a row with no candidate
    return logits, cand


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy", "low_confidence", "confidence_threshold"])
@pytest.mark.parametrize("saturate", [False, True])
def test_unmask_batch_equals_the_per_row_step(alg, saturate):
    from dllm.decode.unmasking import llada_schedule, unmask_batch
    from tests.unmasking_reference import unmask_step

    cfg = UnmaskingConfig(alg=alg, threshold=0.4)
    for seed in range(6):
        logits, cand = _random_case(seed, saturate=saturate)
        block_masks = cand.sum(1) + torch.tensor([0, 2, 1])  # masks at the block start >= masks now
        steps = 5
        for step in range(steps):
            got = unmask_batch(logits, cand, cfg, step, steps, block_masks=block_masks, mask_id=4)
            for row in range(cand.shape[0]):
                quota = llada_schedule(int(block_masks[row]), steps)[step]
                tokens, reveal = unmask_step(logits[row], cand[row], cfg, step, steps, quota, mask_id=4)
                assert torch.equal(got.reveal[row], reveal), (seed, step, row)
                assert torch.equal(got.tokens[row][reveal], tokens[reveal])
            assert not got.invalid.any() and (got.tokens != 4).all()


def test_top_ranked_is_most_confident_per_row():
    from dllm.decode.unmasking import top_ranked

    g = torch.Generator().manual_seed(0)
    conf = torch.randint(0, 4, (5, 12), generator=g).float()  # many ties
    cand = torch.rand(5, 12, generator=g) < 0.6
    k = torch.tensor([0, 1, 3, 12, 5])
    got = top_ranked(conf, cand, k)
    for row in range(5):
        idx = cand[row].nonzero().squeeze(-1)
        want = torch.zeros(12, dtype=torch.bool)
        want[idx[most_confident(conf[row, idx], int(k[row]))]] = True
        assert torch.equal(got[row], want), row


def test_the_documented_draw_order_for_sampled_tokens_and_positions():
    """Temperature > 0: one rand [B, L, V], token = argmax(p / -log u); alg_temp: then one rand [B, L],
    Gumbel noise on conf / alg_temp, top-k by rank."""
    from dllm.decode.unmasking import top_ranked, unmask_batch

    logits, cand = _random_case(3)
    cfg = UnmaskingConfig(alg="maskgit_plus", temperature=0.7, alg_temp=0.5)
    got = unmask_batch(logits, cand, cfg, 1, 3, generator=torch.Generator().manual_seed(11))
    g = torch.Generator().manual_seed(11)
    p = torch.softmax(logits / 0.7, -1)
    u = torch.rand(p.shape, generator=g).clamp(min=torch.finfo(torch.float32).tiny)
    x0 = (p / -u.log()).argmax(-1)
    conf = p.gather(-1, x0[..., None]).squeeze(-1)
    u2 = torch.rand(cand.shape, generator=g).clamp(min=torch.finfo(torch.float32).tiny)
    n = cand.sum(1)
    k = torch.minimum((n.double() * (1 - (1 - 2 * (1 - 1e-3) / 3) / (1 - (1 - 1e-3) / 3))).floor().long(), n)
    want = top_ranked(conf / 0.5 - (-u2.log()).log(), cand, k)
    assert torch.equal(got.tokens, x0) and torch.equal(got.reveal, want)


def test_sampled_tokens_follow_the_tempered_distribution():
    """The exponential race draws from softmax(logits / T): frequencies over 20,000 positions."""
    from dllm.decode.unmasking import choose_tokens

    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5]).log_softmax(0).expand(20000, 5)
    x0, probs, invalid = choose_tokens(
        logits, UnmaskingConfig(temperature=1.0), torch.Generator().manual_seed(0), mask_id=2
    )
    want = torch.tensor([1.0, 0.0, -math.inf, 2.0, 0.5]).softmax(0)
    freq = torch.bincount(x0, minlength=5).double() / x0.numel()
    assert freq[2] == 0 and not invalid.any()
    assert (freq - want).abs().max() < 0.015  # 4.5 sigma of the largest binomial share
    assert torch.allclose(probs[0], want.float())


def test_gumbel_top_k_positions_follow_softmax_of_confidence():
    """alg_temp: the first position chosen is distributed as softmax(conf / alg_temp) over candidates."""
    from dllm.decode.unmasking import top_ranked

    conf = torch.tensor([[0.2, 0.9, 0.5, 0.7]]).expand(20000, 4)
    cand = torch.tensor([[True, True, True, False]]).expand(20000, 4)
    g = torch.Generator().manual_seed(1)
    u = torch.rand(conf.shape, generator=g)
    pick = top_ranked(conf / 0.3 - (-u.log()).log(), cand, torch.ones(20000, dtype=torch.long))
    freq = pick.double().mean(0)
    want = torch.tensor([0.2, 0.9, 0.5, -math.inf]).div(0.3).softmax(0).double()
    assert (pick.sum(1) == 1).all() and freq[3] == 0
    assert (freq - want).abs().max() < 0.015


# --- the mask token is never chosen, NaN logits are an error ------------------------------------------


class _MaskTopModel(StubModel):
    """The mask id has the highest logit at every position (row 2 of the table and every other row)."""

    def __init__(self, family="dream", nan_at=None):
        super().__init__(family)
        self.logp[:, MASK] = 5.0
        if nan_at is not None:
            self.logp[nan_at, 1] = math.nan


@pytest.mark.parametrize(
    "alg,kw",
    [
        ("maskgit_plus", {}),
        ("confidence_threshold", {"threshold": 0.65}),
        ("low_confidence", {}),
        ("entropy", {"temperature": 0.8, "seed": 0}),
        ("origin", {"temperature": 1.0, "seed": 0}),
    ],
)
def test_generate_never_returns_the_mask_token(alg, kw):
    # main wrote the mask id at every reveal ([[3, 3, 3, 3]] and the positions stayed masked)
    m = _MaskTopModel("llada" if alg == "low_confidence" else "dream")
    res = dllm.generate(m, torch.tensor([[0, 1, 2]]), gen_length=4, steps=4, alg=alg, **kw)
    assert (res.tokens != MASK).all()
    if not kw.get("temperature"):  # greedy: the argmax of the real tokens
        assert res.tokens[0].tolist() == ARGMAX


def test_nan_logits_are_an_error_naming_step_and_position():
    # main turned them into token 0 silently
    m = _MaskTopModel(nan_at=2)
    with pytest.raises(ValueError, match=r"NaN logits at denoising step 0, batch row 0, response position 2"):
        dllm.generate(m, torch.tensor([[0, 1, 2]]), gen_length=4, steps=4, alg="maskgit_plus")
    with pytest.raises(ValueError, match=r"NaN logits at denoising step 0, batch row 0, response position 2"):
        dllm.generate(m, torch.tensor([[0, 1, 2]]), gen_length=4, steps=4, alg="entropy", temperature=1.0, seed=0)
    # a NaN outside the block being decoded is not read: block 0 (positions 0-1) decodes, block 1 raises
    with pytest.raises(ValueError, match=r"step 2, batch row 0, response position 2"):
        dllm.generate(
            m, torch.tensor([[0, 1, 2]]), gen_length=4, steps=4, block_length=2, alg="maskgit_plus", block_cache="off"
        )


# --- every argument of generate is checked up front, naming the argument -------------------------------


@pytest.mark.parametrize(
    "kw,error,match",
    [
        ({"steps": 2.7}, TypeError, "steps must be an integer, got float 2.7"),  # main ran 2 steps
        ({"block_length": 4.9}, TypeError, "block_length must be an integer"),  # main ran blocks of 4
        ({"gen_length": True}, TypeError, "gen_length must be an integer, got bool"),  # main: one token
        ({"gen_length": 8.0}, TypeError, "gen_length must be an integer, got float 8.0"),  # main: torch's error
        ({"steps": False}, TypeError, "steps must be an integer, got bool"),
        ({"gen_length": 0}, ValueError, "gen_length must be >= 1, got 0"),
        ({"block_length": -2}, ValueError, "block_length must be >= 1, got -2"),
        ({"live_window": 1.5}, TypeError, "live_window must be an integer"),
        ({"top_k": 2.0}, TypeError, "top_k must be an integer"),
        ({"top_k": True}, TypeError, "top_k must be an integer"),
        ({"temperature": math.nan}, ValueError, "temperature must be a finite number >= 0, got nan"),
        # main: greedy for nan, a "NaN logits" error for inf
        ({"temperature": math.inf}, ValueError, "temperature must be a finite number >= 0, got inf"),
        ({"temperature": -0.5}, ValueError, "temperature must be a finite number >= 0"),
        ({"temperature": "0.7"}, TypeError, "temperature must be a real number, got str"),
        ({"temperature": True}, TypeError, "temperature must be a real number, got bool"),
        ({"top_p": math.nan}, ValueError, "top_p must be in \\(0, 1\\], got nan"),
        ({"top_p": 1.5}, ValueError, "top_p must be in \\(0, 1\\]"),
        ({"alg_temp": -1}, ValueError, "alg_temp must be a finite number >= 0"),  # main accepted it
        ({"alg_temp": math.inf}, ValueError, "alg_temp must be a finite number >= 0"),
        ({"alg_temp": math.nan}, ValueError, "alg_temp must be a finite number >= 0"),
        # T or 1/T overflows float32 (once a "NaN logits" error blaming the model, or a torch error)
        (
            {"temperature": 1e39},
            ValueError,
            r"temperature must be .*got 1e\+39: 0 \(greedy\) or in \[1.18e-38, 8.51e\+37\]",
        ),
        ({"temperature": 1e-300}, ValueError, r"temperature must be .*got 1e-300: 0 \(greedy\) or in \[1.18e-38"),
        ({"alg_temp": 1e300}, ValueError, r"alg_temp must be .*got 1e\+300: 0 or in \[1.18e-38, 8.51e\+37\]"),
        ({"alg_temp": 1e300, "draw_order": "official"}, ValueError, r"alg_temp must be .*in \[1.18e-38"),
        ({"temperature": 10**400}, ValueError, "temperature must be a finite number, got 1000"),  # OverflowError
        ({"eps": math.nan}, ValueError, "eps must be in \\(0, 1\\)"),
        ({"threshold": math.nan}, ValueError, "threshold must be in \\(0, 1\\]"),
        ({"seed": -1}, ValueError, "seed must be an integer in \\[0, 2\\*\\*64\\), got -1"),  # main accepted it
        ({"seed": 2**64}, ValueError, "seed must be an integer in \\[0, 2\\*\\*64\\)"),
        ({"seed": 1.0}, TypeError, "seed must be an integer, got float"),
        ({"seed": True}, TypeError, "seed must be an integer, got bool"),
        ({"cuda_graph": 1}, TypeError, "cuda_graph must be bool or NoneType"),
        # typos of prefix_cache's options once passed unseen with method="dense" (the default)
        ({"cache_refresh": "blok"}, ValueError, r"cache_refresh must be one of \('block', 'step'\), got 'blok'"),
        ({"cache_scope": "seq"}, ValueError, r"cache_scope must be one of \('sequence', 'prompt'\), got 'seq'"),
        ({"cache_scope": None}, ValueError, "cache_scope must be one of"),
        ({"method": "prefix_cache", "cache_refresh": "Step"}, ValueError, "cache_refresh must be one of"),
        ({"progress": None}, TypeError, "progress must be bool"),
    ],
)
def test_generate_refuses_each_bad_argument_by_name(kw, error, match):
    m = StubModel()
    with pytest.raises(error, match=match):
        dllm.generate(m, torch.tensor([[0, 1, 2]]), **{"gen_length": 4, **kw})
    assert m.history == []  # refused before any forward


def test_generate_takes_numpy_integers_and_reals():
    np = pytest.importorskip("numpy")
    want = run("maskgit_plus")[1]
    m = StubModel()
    res = dllm.generate(
        m,
        torch.tensor([[0, 1, 2]]),
        gen_length=np.int64(4),
        steps=np.int32(4),
        block_length=np.int64(4),
        temperature=np.float32(0.0),
        seed=np.uint64(2**64 - 1),
        alg="maskgit_plus",
    )
    assert res.tokens[0].tolist() == want and res.stats.steps == 4
    assert UnmaskingConfig(temperature=np.float64(0.5), top_k=np.int16(3), alg_temp=0).top_k == 3


@pytest.mark.parametrize("draw_order", ["batched", "official"])
@pytest.mark.parametrize(
    "alg,family", [("maskgit_plus", "dream"), ("low_confidence", "llada"), ("confidence_threshold", "dream")]
)
def test_tiny_temperature_is_the_greedy_limit_not_nan(alg, family, draw_order):
    """Logits of about 50 over T = 1e-37 (or the smallest accepted, 2**-126) overflowed
    logits / T to inf in float32: main raised "NaN logits" blaming the model. The tempered logits are
    shifted by their maximum first (the official order: in the rows where its own division overflows):
    the limit, the argmax one-hot (the table's maxima are unique), so the greedy tokens."""
    _, greedy, _ = run(alg, family=family)
    for t in (1e-37, 2.0**-126):
        m = StubModel(family)
        m.logp = m.logp + 50.0  # the same distributions (softmax is shift-invariant)
        res = dllm.generate(
            m, torch.tensor([[0, 1, 2]]), gen_length=4, steps=4, alg=alg, temperature=t, seed=0, draw_order=draw_order
        )
        assert res.tokens[0].tolist() == greedy == ARGMAX


def test_tiny_alg_temp_official_is_the_top_k_limit():
    """alg_temp = 1e-30 with the official order: softmax(conf / alg_temp) was NaN and
    torch.multinomial raised (T = 1e-30 in float32: weights one-hot, so the last step's second draw had
    zero weight, fell off the masks and main returned the mask token); now the most confident positions
    (the top-k order of alg_temp 0), every mask revealed."""
    want = run("maskgit_plus")[0]
    for order in ("batched", "official"):
        for t in (1e-30, 2.0**-126):
            order_got, final, _ = run("maskgit_plus", alg_temp=t, seed=0, draw_order=order)
            assert order_got == want and final == ARGMAX, (order, t)


def test_huge_temperature_samples_every_real_token():
    """T = 8e37 (in range): every real token about equally likely, never the mask (whose
    -inf logit made -inf / inf = NaN with an unshifted division in float32 for T past its range)."""
    from dllm.decode.unmasking import choose_tokens

    logits = torch.tensor([5.0, 0.0, -math.inf, -3.0]).expand(6000, 4)
    x0, _, invalid = choose_tokens(
        logits, UnmaskingConfig(temperature=8e37), torch.Generator().manual_seed(0), mask_id=2
    )
    freq = torch.bincount(x0, minlength=4).double() / x0.numel()
    assert not invalid.any() and freq[2] == 0
    assert (freq[[0, 1, 3]] - 1 / 3).abs().max() < 0.03  # 5 sigma of a share of 1/3 over 6000


def test_entropy_alg_temp_near_the_lower_bound_ranks_by_confidence():
    """Entropy's confidences are negative (to -log V): over alg_temp = 2**-126 the flat
    positions' conf / alg_temp overflowed to -inf, tied, and the batched Gumbel-top-k took the leftmost (position
    0, the flattest) where the limit is the top-k by confidence; ties of the key now go by confidence."""
    from dllm.decode.unmasking import unmask_batch

    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([0.05, 0.1, 0.2, 0.4, 1.0, 2.0, 4.0, 8.0])  # flat (entropy about -5.7) to peaked
    logits = torch.randn(1, 8, 300, generator=g) * scale[None, :, None]
    cand = torch.ones(1, 8, dtype=torch.bool)
    picks = [
        unmask_batch(logits, cand, UnmaskingConfig(alg="entropy", alg_temp=t), 1, 3, generator=torch.Generator())
        .reveal[0]
        .tolist()
        for t in (None, 2.0**-126)
    ]
    assert picks[0] == picks[1] == [False] * 5 + [True] * 3
