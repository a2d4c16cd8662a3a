"""The Dream-7B-shaped end-to-end speed run (bench/speed/e2e_dream_shape.py) on its 2-layer CPU shape.

Checked against independent values: the vendored Dream config's numbers and a meta-built model's own
parameter count, a hand count of FLOPs for the prediction, the number of forwards each method runs, and
the logits rows the model computes (live rows only: what keeps dense at 32K inside an H200's memory).
"""

import csv
import json

import pytest
import torch

from bench.budget import TimeBudget
from bench.speed import e2e_dream_shape as E
from bench.speed import host_step as H
from dllm import DiffusionLM, PrefillingConfig


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """main() sets the CPU thread count (--threads): give the rest of the session its own back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


DREAM = {
    "num_layers": 28,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_heads": 28,
    "num_kv_heads": 4,
    "head_dim": 128,
    "vocab_size": 152064,
}


def test_dream7b_shape_is_the_vendored_config():
    cfg = E.dream7b_config()
    raw = json.loads((E.DREAM_CONFIG_DIR / "config.json").read_text())
    assert {k: getattr(cfg, k) for k in DREAM} == DREAM
    assert (cfg.hidden_size, cfg.num_layers, cfg.vocab_size) == (
        raw["hidden_size"],
        raw["num_hidden_layers"],
        raw["vocab_size"],
    )
    assert cfg.family == "dream" and cfg.qkv_bias and not cfg.tie_word_embeddings
    with torch.device("meta"):  # no memory: count what the module really holds
        model = DiffusionLM(cfg)
    assert E.n_params(cfg) == sum(p.numel() for p in model.parameters())
    assert 7.6e9 < E.n_params(cfg) < 7.7e9  # Dream-v0-7B / Qwen2.5-7B: 7.62 B


def test_cpu_shape_keeps_dreams_family_and_gqa_group():
    cfg = E.cpu_config()
    assert cfg.family == "dream" and cfg.shift_logits and cfg.num_layers == 2
    assert cfg.gqa_group == E.dream7b_config().gqa_group == 7
    with torch.device("meta"):
        assert E.n_params(cfg) == sum(p.numel() for p in DiffusionLM(cfg).parameters())


def test_random_model_is_built_in_the_asked_dtype():
    cfg = E.cpu_config()
    model = E.build_random_model(cfg, "cpu", torch.bfloat16, seed=3)
    params = dict(model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert all(not p.requires_grad and not p.is_meta for p in params.values())
    assert torch.equal(params["norm.weight"], torch.ones(cfg.hidden_size, dtype=torch.bfloat16))
    assert not params["layers.0.self_attn.q_proj.bias"].any()
    w = params["layers.1.mlp.up_proj.weight"].float()
    assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.001
    again = E.build_random_model(cfg, "cpu", torch.bfloat16, seed=3)
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)  # seeded
    with pytest.raises(ValueError, match="floating"):
        E.build_random_model(cfg, "cpu", torch.int8)


def test_random_prompt_parts():
    cfg = E.cpu_config()
    parts = E.random_prompt(cfg, 700, "cpu", seed=1)
    assert parts.full().numel() == 700
    assert (parts.prefix.numel(), parts.query.numel()) == (E.PREFIX_TOKENS, E.QUERY_TOKENS)
    assert int(parts.prefix[0]) == cfg.bos_token_id
    assert not (parts.full() == cfg.mask_token_id).any()
    assert int(parts.full().max()) < cfg.vocab_size and int(parts.full().min()) >= 0
    assert torch.equal(E.random_prompt(cfg, 700, "cpu", seed=1).context, parts.context)
    with pytest.raises(ValueError, match="no context"):
        E.random_prompt(cfg, 64, "cpu")
    # Dream's mask id 151666 lies inside the vocabulary: 2M draws would hit it ~13 times, and the ids on
    # both sides of it still occur
    dream = E.dream7b_config()
    ids = E.random_prompt(dream, 2_000_000, "cpu").full()
    assert not (ids == dream.mask_token_id).any()
    assert (ids == dream.mask_token_id - 1).any() and (ids == dream.mask_token_id + 1).any()
    assert int(ids.max()) < dream.vocab_size


def test_dense_prediction_is_the_hand_count():
    """32 dense steps at 32K: 2 x (non-embedding weights) x tokens + 4 x layers x Hq D x tokens^2 (+ LM head)."""
    cfg = E.dream7b_config()
    n = 32768 + 32
    d, hd = cfg.hidden_size, cfg.num_heads * cfg.head_dim
    biases = hd + 2 * cfg.num_kv_heads * cfg.head_dim
    norms = 2 * d
    matrices = (E.n_params(cfg) - 2 * cfg.vocab_size * d - d) / cfg.num_layers - biases - norms
    flops = 2 * matrices * cfg.num_layers * n + 4 * cfg.num_layers * hd * n * n + 2 * d * cfg.vocab_size * 32
    per_step = flops / (E.MMA_EFFICIENCY * 989e12) + E.HOST_S_PER_LAYER * cfg.num_layers
    got = E.predict_cell_s(cfg, "dense", 32768, 32, 32, 1024, 4)
    assert got["decode"] == pytest.approx(32 * per_step, rel=1e-6)
    assert 0.8e15 < flops < 0.95e15  # ~0.86 PFLOP per step: about 1.7 s at half the H200's bf16 peak


def test_prefilling_prediction_grows_slower_than_dense():
    cfg = E.dream7b_config()
    pred = {(m, n): E.predict_cell_s(cfg, m, n, 32, 32, 1024, 4) for m in E.METHODS for n in (8192, 32768)}
    # the static top-K cache makes prefilling's decode independent of the context length
    assert pred["prefilling", 8192]["decode"] == pytest.approx(pred["prefilling", 32768]["decode"])
    ratio = {n: sum(pred["dense", n].values()) / sum(pred["prefilling", n].values()) for n in (8192, 32768)}
    assert 1 < ratio[8192] < ratio[32768]
    with pytest.raises(ValueError, match="unknown method"):
        E.predict_cell_s(cfg, "sparse", 8192, 32, 32, 1024, 4)


def test_dense_computes_only_the_live_logits():
    """Every forward of the dense loop returns [1, gen, V] logits, never [1, prompt + gen, V] (at 32K x 152K
    vocabulary in bf16 the full rows would be 10 GB)."""
    cfg = E.cpu_config()
    model = E.build_random_model(cfg, "cpu", torch.float32)
    parts = E.random_prompt(cfg, 512, "cpu")
    shapes = []
    model.register_forward_hook(lambda mod, args, out: shapes.append(tuple(out.logits.shape)))
    res = E._decode(model, parts, "dense", PrefillingConfig(chunk_size=64, top_k=4), 8, 8)
    assert shapes == [(1, 8, cfg.vocab_size)] * 8 and res.stats.nfe == 8


def test_run_at_cpu_shape_writes_every_cell(tmp_path, capsys):
    rc = E.main(["--shape", "cpu", "--lengths", "512", "1024", "--gen-length", "16", "--out", str(tmp_path)])
    assert rc == 0
    rows = list(csv.DictReader(open(tmp_path / "e2e_dream_shape.csv")))
    assert [(int(r["length"]), r["method"]) for r in rows] == [(n, m) for n in (512, 1024) for m in E.METHODS]
    assert {r["status"] for r in rows} == {"ok"} and {r["shape"] for r in rows} == {"cpu"}
    assert all(r["commit"] and r["device_kind"].startswith("CPU") for r in rows)  # provenance on every row
    for r in rows:
        assert int(r["steps"]) == 16  # fixed-step rule: one token per step whatever the random logits say
        assert float(r["total_s"]) >= float(r["decode_s"]) > 0
        assert float(r["step_s"]) == pytest.approx(float(r["decode_s"]) / 16)
        n_chunks = -(-(int(r["length"]) - E.PREFIX_TOKENS - E.QUERY_TOKENS) // 64)
        # forwards: dense one per step; prefix_cache + 1 cache build; prefilling + chunked prefill, prefix,
        # draft pass and the two scoring passes (s_I, s_P), and a static cache of prefix + 4 chunks of C + 1
        assert int(r["nfe"]) == {"dense": 16, "prefix_cache": 17, "prefilling": 21}[r["method"]], r
        if r["method"] == "prefilling":
            assert int(r["cached_tokens"]) == E.PREFIX_TOKENS + 4 * 65 and n_chunks > 4
    table = (tmp_path / "e2e_dream_shape.md").read_text()
    assert table.splitlines()[0] in capsys.readouterr().out  # printed too
    lines = [ln for ln in table.splitlines() if ln.startswith("| 1024 |")]
    by = {ln.split(" | ")[1]: ln.split(" | ") for ln in lines}
    tot = {r["method"]: float(r["total_s"]) for r in rows if int(r["length"]) == 1024}  # unrounded, from the CSV
    assert by["prefilling"][10] == f"{tot['dense'] / tot['prefilling']:.1f}x"  # vs dense, from the totals
    assert by["prefilling"][14].startswith(E.PAPER_ANCHOR)


def _run_cpu(budget_s, **kw):
    return E.run(
        E.shape_of("cpu"),
        device="cpu",
        dtype=torch.float32,
        lengths=(512,),
        methods=E.METHODS,
        gen=8,
        steps=8,
        pcfg=PrefillingConfig(chunk_size=64, top_k=4),
        budget_s=budget_s,
        log=lambda s: None,
        **kw,
    )


def test_budget_skips_cells_with_their_predicted_time():
    shape = E.shape_of("cpu")
    saved = []
    rows, _ = _run_cpu(0.0, checkpoint=lambda rows: saved.append(len(rows)))
    assert [r["status"] for r in rows] == ["skipped: budget spent"] * 3
    assert saved == [1, 2, 3]  # the CSV is rewritten after every cell
    table = E.summarize(rows, shape, steps=8, gen=8)
    assert table.count("skipped: budget spent") == 3


def test_time_budget_calibration():
    b = TimeBudget(100.0)
    assert b.predict("dense", 2.0) == 2.0  # unscaled before a measurement
    b.calibrate("dense", measured_s=6.0, model_s=2.0)
    assert b.predict("dense", 10.0) == pytest.approx(30.0) and b.predict("prefilling", 10.0) == 10.0
    assert b.skip_if_over(("dense", 8192), 50.0) is None
    reason = b.skip_if_over(("dense", 32768), 150.0)
    assert reason.startswith("skipped: predicted 150.0 s > ") and b.skipped[("dense", 32768)] == reason


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shape", "dream7b", "--device", "cpu"], "needs a CUDA device"),
        (["--shape", "cpu", "--lengths", "200"], "fewer than top-k 4"),
        (["--shape", "cpu", "--gen-length", "0"], ">= 1"),
    ],
)
def test_cli_errors(argv, message, capsys, tmp_path):
    assert E.main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_predict_only_prints_the_dream7b_table_without_a_gpu(capsys):
    assert E.main(["--shape", "dream7b", "--predict-only"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split(" | ") for ln in out.splitlines() if ln.startswith("| 32768 |")]
    assert [r[1] for r in rows] == ["dense", "prefix_cache", "prefilling"]
    assert all(r[2] == "predicted" for r in rows) and "predicted, not measured" in out


def test_out_of_memory_is_a_row_not_a_crash(monkeypatch):
    real = E.run_cell

    def oom_for_dense(model, parts, method, *args):
        if method == "dense":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 60.00 GiB")
        return real(model, parts, method, *args)

    monkeypatch.setattr(E, "run_cell", oom_for_dense)
    rows, _ = _run_cpu(60.0)
    assert {r["method"]: r["status"] for r in rows} == {"prefilling": "ok", "prefix_cache": "ok", "dense": "OOM"}
    assert "60.00 GiB" in rows[-1]["error"]


def test_host_time_mode_at_two_layers(tmp_path):
    """bench.speed.host_step on a 2-layer copy of the layout: the report's rows, positive and consistent numbers, and
    the predicted GPU time of a Dream-7B step checked against the weight read it is bound by."""
    assert H.main(["--layers", "2", "--rounds", "1", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "e2e_dream_shape_host.md").read_text()
    assert text.startswith("# Host time per denoising step") and "Machine: CPU" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 7  # header + eager, forward, graph, replay, graph total, predicted eager launches
    assert "(2 layers, 28 query / 4 KV heads, GQA group 7)" in text

    cfg = H.host_config(2)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.gqa_group, cfg.num_layers) == (28, 4, 7, 2)
    assert H.host_config().num_layers == 28
    m = H.measure_host_step(cfg, rounds=1, gen=4)
    assert m["steps"] == 4 and m["layers"] == 2 and m["live_tokens"] == H.HOST_QUERY + 4
    assert m["kept_tokens"] == H.HOST_PREFIX + 4 * (H.HOST_CHUNK + 1)  # prefix + 4 chunks with their BOS anchor
    for key in ("eager_cpu_s", "eager_wall_s", "graph_cpu_s", "graph_wall_s"):
        assert 0 < m[key] < 5.0, key
    assert m["graph_cpu_s"] < m["eager_cpu_s"]  # the graph step drops the whole forward
    assert m["forward_cpu_s"] == pytest.approx(m["eager_cpu_s"] - m["graph_cpu_s"])
    assert 0 < m["graph_ops"] < m["eager_ops"]

    # Dream-7B's step reads 2 x 7.62e9 bf16 weights at 80% of 4.8 TB/s (~4 ms); its FLOPs take less
    n = E.n_params(E.dream7b_config())
    weights_s = 2 * n / (0.8 * 4.8e12)
    gpu_s = H.predict_step_gpu_s(E.dream7b_config(), 32, 1024, 4)
    kv_s = 2 * 28 * 4 * 128 * (16 + 4 * 1025) * 2 / (0.8 * 4.8e12)
    assert gpu_s == pytest.approx(weights_s + kv_s, rel=1e-9)
    flops_s = 2 * n * (48 + 32) / (0.5 * 989e12)
    assert flops_s < gpu_s
