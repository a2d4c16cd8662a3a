"""The denoising step a CUDA graph captures: a pure function of static buffers, run eagerly on CPU here.

``dllm.decode.policies.live_block_logits`` reads the live block's fixed buffers (ids, positions, precomputed
RoPE tables, live lengths, response columns) and the static cache; ``dllm.decode.step_graph.GraphedStep``
captures it on CUDA. On CPU the tests check that this static-buffer path gives the logits of a plain
forward (ids concatenated afresh, RoPE computed from the positions, ``logits_start``) at every step of
whole generations, that no buffer is reallocated between steps, and the wrapper's control flow
(warm-up, one capture, replays) with a stand-in for the CUDA graph API. The real capture is checked
token for token on a GPU (``bench/gpu_check.sh``, stage ``cuda_graph``, and the CUDA-only test below).
"""

import contextlib
import sys

import pytest
import torch

import dllm
from dllm.decode import step_graph
from dllm.decode.denoise import denoise
from dllm.decode.timer import PhaseTimer
from dllm.decode.unmasking import UnmaskingConfig
from dllm.model.kv_cache import StaticKVCache
from dllm.prefilling import PrefillingConfig, PromptParts, build_prefilling_policy
from tests.tiny_checkpoints import load_tiny

BOS = 128


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    return load_tiny(tmp_path_factory, "dream", seed=41)


def _rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda n: torch.randint(0, 120, (n,), generator=g)
    pre = torch.cat([torch.tensor([BOS]), r(5)])
    return [PromptParts(pre, r(41), r(6)), PromptParts(pre[:3], r(23), r(10))]


class _Checked:
    """Runs the policy's static step and, beside it, a plain forward of each row; records the buffers."""

    def __init__(self, model, policy, queries, starts, exact):
        self.model, self.policy, self.queries, self.starts, self.exact = model, policy, queries, starts, exact
        self.inputs = []
        self.steps = 0
        self.widths = set()  # logit rows a step returned
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        rope = kwargs.get("rope")
        self.inputs.append(
            (args[0].data_ptr(), args[1].data_ptr(), None if rope is None else [t.data_ptr() for t in rope])
        )

    @property
    def batch_size(self):
        return self.policy.batch_size

    @property
    def nfe(self):
        return self.policy.nfe

    def prepare(self, resp, block, step):
        self.block = block
        self.policy.prepare(resp, block, step)

    def logits(self, resp):
        got = self.policy.logits(resp)
        # a block narrower than the response: the policy computes that block's logits only
        block = self.block if got.shape[1] != resp.shape[1] else slice(0, resp.shape[1])
        assert got.shape[1] == block.stop - block.start
        self.widths.add(got.shape[1])
        self.handle.remove()
        try:
            cache = self.policy.cache
            for b, (query, start) in enumerate(zip(self.queries, self.starts)):
                ids = torch.cat([query, resp[b]])[None]
                row = StaticKVCache(cache.k, cache.v, cache.seg_slots[b : b + 1], cache.seg_lens[b : b + 1])
                pos = torch.arange(start, start + ids.shape[1])
                cols = query.numel() + torch.arange(block.start, block.stop)[None]
                want = self.model(ids, pos, row, logits_at=cols).logits[0]
                if self.exact:
                    assert torch.equal(got[b], want), f"step {self.steps} row {b}"
                else:
                    assert (got[b] - want).abs().max().item() < 1e-5, f"step {self.steps} row {b}"
        finally:
            self.handle = self.model.register_forward_pre_hook(self._record, with_kwargs=True)
        self.steps += 1
        return got


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("alg", ["maskgit_plus", "confidence_threshold"])
def test_static_step_equals_a_plain_forward_over_a_whole_generation(dream, batched, alg):
    rows = _rows()
    cfg = PrefillingConfig(chunk_size=8, top_k=2, token_budget=4, pool_kernel=3)
    prompt = rows if batched else rows[0]
    setup = build_prefilling_policy(dream, None, prompt, cfg, PhaseTimer("cpu"), gen_length=8)
    queries = [r.parts.query for r in setup.rows]
    starts = [r.row.query_start for r in setup.rows]
    # one row: bit for bit (same kernels, same shapes); padded rows: to round-off
    checked = _Checked(dream, setup.policy, queries, starts, exact=not batched)
    resp = torch.full((len(queries), 8), dream.mask_token_id)
    ucfg = UnmaskingConfig(alg=alg, threshold=0.05)
    try:
        with torch.no_grad():
            n = denoise(checked, resp, mask_id=dream.mask_token_id, block_length=4, steps_per_block=4, cfg=ucfg)
    finally:
        checked.handle.remove()
    assert n == checked.steps >= 2
    assert checked.widths == {4}  # blocks of 4 of an 8-token response: the LM head ran on the block only
    # the static buffers: the same ids, positions and RoPE tables at every step, nothing reallocated
    assert len(checked.inputs) == n and len(set(map(repr, checked.inputs))) == 1
    live = setup.policy.live
    assert checked.inputs[0] == (
        live.ids.data_ptr(),
        live.positions.data_ptr(),
        [live.cos.data_ptr(), live.sin.data_ptr()],
    )
    # and the tokens are generate()'s
    out = dllm.generate(
        dream,
        method="prefilling",
        prompt=prompt,
        prefilling=cfg,
        gen_length=8,
        steps=8,
        block_length=4,
        alg=alg,
        threshold=0.05,
    )
    assert torch.equal(out.tokens, resp)


def test_precomputed_rope_tables_are_the_model_s(dream):
    setup = build_prefilling_policy(
        dream, None, _rows(), PrefillingConfig(chunk_size=8, top_k=1), PhaseTimer("cpu"), gen_length=5
    )
    live = setup.policy.live
    cos, sin = dream.rope.cos_sin(live.positions)
    assert torch.equal(live.cos, cos) and torch.equal(live.sin, sin)
    assert live.cos.shape == (2, 10 + 5, dream.config.head_dim)
    assert live.positions[:, 0].tolist() == [r.row.query_start for r in setup.rows]


def test_cuda_graph_support_says_why_not_here(dream, monkeypatch):
    ok, why = step_graph.cuda_graph_support("cpu")
    assert not ok and "CUDA device" in why
    parts = _rows()[0]
    kw = dict(method="prefilling", prompt=parts, prefilling=PrefillingConfig(chunk_size=8, top_k=1), gen_length=4)
    with pytest.raises(ValueError, match="cuda_graph=True is not supported here: the model is on cpu"):
        dllm.generate(dream, cuda_graph=True, **kw)
    assert torch.equal(dllm.generate(dream, cuda_graph=False, **kw).tokens, dllm.generate(dream, **kw).tokens)
    with pytest.raises(ValueError, match="options of method='prefilling'"):
        dllm.generate(dream, parts.full()[None], method="dense", cuda_graph=False)
    with pytest.raises(RuntimeError, match="cannot capture the denoising step"):
        step_graph.GraphedStep(lambda: torch.zeros(1))()


class _FakeGraph:
    """Stand-in for torch.cuda.CUDAGraph: replay re-runs what was captured into the captured output."""

    capturing = None
    owner = None  # the GraphedStep whose output buffer a replay writes

    def __init__(self):
        self.fn = None
        self.replays = 0

    def replay(self):
        self.replays += 1
        _FakeGraph.owner._out.copy_(self.fn())


_RECORD = {"supported_for": [], "entered": []}  # devices asked about / entered under the fake CUDA API


@pytest.fixture()
def fake_cuda(monkeypatch):
    """torch.cuda's graph API replaced by :class:`_FakeGraph`; returns the list of graphs made and a switch
    that makes the next capture fail."""
    graphs, fail = [], []

    @contextlib.contextmanager
    def fake_graph(g):
        _FakeGraph.capturing = g
        try:
            if fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            yield
        finally:
            _FakeGraph.capturing = None
            g.fn = _FakeGraph.owner.fn

    def new_graph():
        graphs.append(_FakeGraph())
        return graphs[-1]

    class _Stream:
        def wait_stream(self, other):
            pass

    supported_for, entered = _RECORD["supported_for"], _RECORD["entered"]
    supported_for.clear()
    entered.clear()

    def support(device):
        supported_for.append(torch.device(device))
        return True, ""

    @contextlib.contextmanager
    def fake_device(d):
        entered.append(torch.device(d))
        yield

    monkeypatch.setattr(step_graph, "cuda_graph_support", support)
    monkeypatch.setattr(torch.cuda, "device", fake_device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", new_graph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    return graphs, fail


def _counting_fn(calls, state):
    def fn():
        calls.append("capture" if _FakeGraph.capturing else "eager")
        return state * 2

    return fn


def test_graphed_step_warms_up_captures_once_and_replays(fake_cuda):
    graphs, _ = fake_cuda
    calls, state = [], torch.zeros(3)
    step = _FakeGraph.owner = step_graph.GraphedStep(_counting_fn(calls, state))
    outs = []
    for i in range(4):
        state.fill_(i)
        outs.append(step())
        assert outs[-1].tolist() == [2.0 * i] * 3
    assert calls[:2] == ["eager", "capture"] and step.warmup_calls == 1
    assert step.captures == 1 and len(graphs) == 1 and graphs[0].replays == 4 and step.replaying
    assert all(o is outs[0] for o in outs)  # one output buffer, overwritten by each replay


def test_a_failed_capture_raises_or_falls_back_to_eager_steps(fake_cuda):
    _, fail = fake_cuda
    fail.append(True)
    calls, state = [], torch.ones(2)
    strict = _FakeGraph.owner = step_graph.GraphedStep(_counting_fn(calls, state))
    with pytest.raises(RuntimeError, match="stream is capturing"):
        strict()
    auto = _FakeGraph.owner = step_graph.GraphedStep(_counting_fn(calls, state), fallback=True)
    with pytest.warns(UserWarning, match="capture of the denoising step failed, running it eagerly"):
        first = auto()
    calls.clear()
    state.fill_(5)
    assert first.tolist() == [2.0, 2.0] and auto().tolist() == [10.0, 10.0] and calls == ["eager"]
    assert not auto.replaying and "stream is capturing" in auto.failed and auto.captures == 0


def test_graph_capture_runs_on_the_model_s_device_not_the_current_one(fake_cuda):
    """A model on cuda:1 while the current device is 0: support is asked for cuda:1 and the side stream,
    warm-up and capture run under torch.cuda.device(cuda:1) (main used the current device)."""
    calls, state = [], torch.zeros(2)
    step = _FakeGraph.owner = step_graph.GraphedStep(_counting_fn(calls, state), device="cuda:1")
    step()
    assert _RECORD["supported_for"] == [torch.device("cuda", 1)] and _RECORD["entered"] == [torch.device("cuda", 1)]
    assert calls[:2] == ["eager", "capture"] and step.replaying
    # without a device: the current one (index 0 here)
    step0 = _FakeGraph.owner = step_graph.GraphedStep(_counting_fn(calls, state))
    step0()
    assert _RECORD["supported_for"][-1] == torch.device("cuda", 0) == _RECORD["entered"][-1]


def test_phase_timer_records_on_the_timed_device_s_stream(monkeypatch):
    """PhaseTimer("cuda:1") records its events on cuda:1's current stream, not the current device's."""
    from dllm.decode.timer import PhaseTimer

    streams, recorded = [], []

    class _Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self, stream=None):
            recorded.append(stream)

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 250.0

    def current_stream(device=None):
        streams.append(torch.device(device) if device is not None else None)
        return f"stream of {device}"

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    timer = PhaseTimer("cuda:1")
    with timer.phase("decode"):
        pass
    assert streams == [torch.device("cuda", 1)] and recorded == ["stream of cuda:1"] * 2
    assert timer.seconds == {"decode": 0.25}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_tokens_equal_eager_tokens_on_cuda():
    model = dllm.load_model(device="cuda")
    if not step_graph.cuda_graph_support(model.device)[0]:
        pytest.skip(step_graph.cuda_graph_support(model.device)[1])
    from bench.fidelity.demo import TINY_PREFILLING
    from dllm.eval.evaluation import case_inputs
    from dllm.eval.tasks import make_case

    rows = [
        case_inputs(model, make_case("passkey", n, 0.5, i, tokenizer=None), "prefilling")["prompt"]
        for i, n in enumerate((2048, 3000))
    ]
    kw = dict(method="prefilling", prefilling=TINY_PREFILLING, gen_length=8, steps=8)
    for prompt in (rows[0], rows):
        eager = dllm.generate(model, prompt=prompt, cuda_graph=False, **kw)
        graph = dllm.generate(model, prompt=prompt, cuda_graph=True, **kw)
        assert torch.equal(eager.tokens, graph.tokens)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is bench/gpu_check.sh's")
def test_cuda_graph_check_skips_cleanly_without_a_gpu(tmp_path, capsys):
    from bench.kernels import cuda_graph_check

    assert cuda_graph_check.main(["--out", str(tmp_path)]) == 0
    assert "cuda_graph_check skipped: no CUDA device here" in capsys.readouterr().out
    assert "Skipped: no CUDA device here." in (tmp_path / "cuda_graph.md").read_text()
    assert not (tmp_path / "cuda_graph.csv").exists()
    assert cuda_graph_check.main(["--out", str(tmp_path), "--dry-run"]) == 0
    assert "skipped: dry run" in capsys.readouterr().out


class _EagerGraph:
    """GraphedStep's interface, run eagerly (the CPU stand-in for the capture)."""

    replaying, failed = True, None

    def __init__(self, fn, fallback=False, device=None):
        self.fn = fn

    def __call__(self):
        return self.fn()


def test_cuda_graph_check_parts_run_on_cpu_with_an_eager_stand_in(dream, monkeypatch):
    """The GPU check's two parts on CPU, the graph replaced by an eager call: rows equal, every field there."""
    from bench.kernels import cuda_graph_check

    monkeypatch.setattr("dllm.decode.policies.GraphedStep", _EagerGraph)
    monkeypatch.setattr(sys.modules["dllm.generate"], "cuda_graph_support", lambda device: (True, ""))
    monkeypatch.setattr(cuda_graph_check, "PASSKEY_LENGTHS", (1100, 1500))
    rows = cuda_graph_check.bundled_rows(gen=4, device="cpu")
    rows += cuda_graph_check.dream_rows(dream, steps=4, repeats=2, chunk=8)
    assert [r["rows"] for r in rows] == [1, 1, 2, 1, 8] and all(r["equal_tokens"] == 1 for r in rows)
    assert rows[-1]["max_logit_diff"] == 0.0 and all(r["eager_ms_per_step"] > 0 for r in rows)
    assert "| dream7b-shape | 2 layers, 8 row(s) | 8 | yes |" in cuda_graph_check.summarize(rows)


def test_select_block_refills_one_static_buffer():
    """The LM head's rows for a semi-autoregressive block: one [B, W] buffer at a fixed address, refilled
    in place per block (a graph captured with it reads the next block); the whole response needs none."""
    from dllm.decode.policies import LiveBlock

    live = LiveBlock([torch.tensor([1, 2, 3]), torch.tensor([4])], 10, 8)  # ragged heads of 3 and 1
    live.select_block(slice(0, 8))
    assert live.block_cols is None
    live.select_block(slice(0, 4))
    buf = live.block_cols
    assert buf.tolist() == [[3, 4, 5, 6], [1, 2, 3, 4]]
    live.select_block(slice(4, 8))
    assert live.block_cols is buf and buf.tolist() == [[7, 8, 9, 10], [5, 6, 7, 8]]
    with pytest.raises(ValueError, match="width"):
        live.select_block(slice(2, 8))
    with pytest.raises(ValueError, match="contiguous"):
        live.select_block(slice(8, 12))


def test_the_block_cached_step_is_what_the_graph_holds(dream, fake_cuda):
    """With a block cache the graph captures the block-only step (fixed shapes for every block) and the refreshes
    run eagerly beside it: the tokens are the eager run's, one capture, a replay for every other step."""
    graphs, _ = fake_cuda
    cfg = PrefillingConfig(chunk_size=8, top_k=2)
    kw = dict(gen_length=8, steps=8, block_length=4, block_cache="block", prefilling=cfg, prompt=_rows()[0])
    eager = dllm.generate(dream, method="prefilling", cuda_graph=False, **kw)
    setup = build_prefilling_policy(dream, None, _rows()[0], cfg, PhaseTimer("cpu"), gen_length=8, cuda_graph=True)
    policy = setup.policy
    policy.use_block_cache(4, "block")
    _FakeGraph.owner = policy.graph
    resp = torch.full((1, 8), dream.mask_token_id)
    with torch.no_grad():
        n = denoise(policy, resp, mask_id=dream.mask_token_id, block_length=4, steps_per_block=4, cfg=UnmaskingConfig())
    assert torch.equal(resp, eager.tokens)
    assert policy.graph.captures == 1 and len(graphs) == 1
    assert policy.block_cache.refreshes == 2 and graphs[0].replays == n - 2
    with pytest.raises(RuntimeError, match="before the first step"):
        policy.use_block_cache(4, "block")
