"""dllm.harness without lm-eval: the --model_args checks, the prompt split, the Monte Carlo log-likelihood.

(What needs lm-eval itself lives in tests/test_harness_lm_eval.py, run by ``make test-harness``.)
"""

import itertools
import json
import math
from types import SimpleNamespace

import pytest
import torch

import dllm
from bench.tiny_defaults import TINY_PREFILLING
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case
from dllm.harness.args import MODEL_ARGS, ModelArgsError, describe_model_args, parse_model_args
from dllm.harness.likelihood import masked_diffusion_loglikelihood
from dllm.harness.split import split_request
from tests.harness_cases import HARNESS_DIR, choice_rows, passkey_rows


@pytest.fixture(scope="module")
def model():
    return dllm.load_model()


# ---------------------------------------------------------------- --model_args


def _error(kwargs) -> str:
    with pytest.raises(ModelArgsError) as info:
        parse_model_args(kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_model_args_typed_like_the_harness_or_as_strings():
    s = parse_model_args(
        {"method": "prefilling", "chunk_size": "128", "top_k": 2, "score_terms": "self_info+pseudo_label"}
    )
    assert s.prefilling.chunk_size == 128 and s.prefilling.top_k == 2
    assert s.prefilling.score_terms == ("self_info", "pseudo_label")
    assert s.explicit_top_k and s.given == {"method", "chunk_size", "top_k", "score_terms"}
    assert parse_model_args({"batch_size": "4", "mc_samples": 16, "greedy_check": "false"}).values["batch_size"] == 4
    assert parse_model_args({"greedy_check": "false"}).greedy_check is False


def test_model_args_defaults_are_the_checkpoints_prefilling_config():
    s = parse_model_args({})
    assert s.method == "prefilling"
    # the bundled model's prefilling_config.json, which test_prefilling_config holds equal to TINY_PREFILLING:
    # C=256, K=4, s = s_C - s_P, boundaries snapped within 64, the first stage engaged by itself on long documents
    # (layer 0), the query's words in the chunk score (lexical_weight)
    assert s.prefilling == TINY_PREFILLING
    assert not s.explicit_top_k
    # top_k=all overrides the file's K (None keeps every chunk)
    assert parse_model_args({"top_k": "all"}).prefilling.top_k is None
    assert parse_model_args({"method": "dense"}).prefilling is None


def test_model_args_draw_order_reaches_generate():
    """The harness takes draw_order, as generate (draw_order) and the CLI (--draw-order official) do."""
    assert parse_model_args({}).generate_kwargs()["draw_order"] == "batched"
    assert parse_model_args({"draw_order": "official"}).generate_kwargs()["draw_order"] == "official"
    assert parse_model_args({"method": "dense", "draw_order": "official", "batch_size": 4}).draw_order == "official"


def test_model_args_text_in_other_scripts_digits_is_refused():
    """lm-eval's own parser turns chunk_size=٣ into the int 3 before our model sees it: the text is
    checked first (python -m dllm.harness, create_from_arg_string); ASCII values and words pass."""
    from dllm.harness import cli
    from dllm.harness.args import check_model_args_text, non_ascii_number

    assert [non_ascii_number(t) for t in ("3", "٣", "١.٥", "½", "λ", "abc", "")] == [
        False, True, True, True, False, False, False,
    ]  # fmt: skip
    check_model_args_text("chunk_size=256,pretrained=/data/модель,top_k=all")
    check_model_args_text('{"chunk_size": 3}')
    with pytest.raises(ModelArgsError, match="model_args top_k='٣': expected ASCII digits"):
        check_model_args_text("chunk_size=256,top_k=٣")
    assert cli.model_args_texts(["--tasks", "x", "--model_args", "a=1,b=2", "c=3", "--limit", "1", "-a=d=4"]) == [
        "a=1,b=2", "c=3", "d=4",
    ]  # fmt: skip


def test_the_harness_entry_point_refuses_other_digits_in_one_line(capsys):
    from dllm.harness import cli

    assert cli.main(["--tasks", "dllm_passkey", "--model_args", "method=dense,steps=٤"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: model_args steps='٤': expected ASCII digits (0-9)"]


def test_model_args_generate_kwargs():
    kw = parse_model_args(
        {"method": "prefix_cache", "sampling_top_k": 5, "steps": 8, "live_window": 3}
    ).generate_kwargs()
    assert kw["top_k"] == 5 and kw["steps"] == 8 and kw["live_window"] == 3
    assert "cuda_graph" not in parse_model_args({}).generate_kwargs()
    assert parse_model_args({"cuda_graph": False}).generate_kwargs()["cuda_graph"] is False


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"chunk": 128}, "unknown key(s) chunk (did you mean chunk_size?)"),
        ({"chunk_size": "abc"}, "chunk_size='abc': expected an integer >= 1"),
        ({"chunk_size": 0}, "chunk_size=0: expected an integer >= 1"),
        ({"chunk_size": True}, "chunk_size=True: expected an integer >= 1"),
        ({"top_k": 0}, "top_k=0: expected an integer >= 1 or 'all'"),
        ({"method": "fast"}, "method='fast': expected one of dense, prefix_cache, prefilling"),
        ({"temperature": -1}, "temperature=-1: expected a finite number >= 0"),
        ({"batch_size": "auto"}, "batch_size='auto': expected an integer >= 1 ('auto' is not supported"),
        ({"score_terms": "self_info,nope"}, "score_terms='self_info,nope': expected terms of"),
        ({"method": "dense", "top_k": 2}, "top_k (method=prefilling): not an option of method=dense"),
        ({"method": "prefilling", "live_window": 2}, "live_window (method=prefix_cache): not an option"),
        ({"token_budget": 999}, "token_budget (B) must be in [1, chunk_size=256]"),
        ({"top_p": 0}, "top_p=0: expected a number in (0, 1]"),
        ({"gen_length": 8, "block_length": 3}, "block_length=3 does not divide gen_length=8"),
        # found before the weights load, against the bundled config.json (4 layers, 1536 positions, 100 tokens);
        # a term twice would count twice in the chunk score
        ({"chunk_size": 1536}, "chunk_size=1536: a chunk and its BOS anchor take 1537 positions, more than"),
        ({"candidate_layer": 99, "candidates": 8}, "candidate_layer=99: the model has 4 layers (0..3, or -4..-1 from"),
        ({"candidate_layer": -5, "candidates": 8}, "candidate_layer=-5: the model has 4 layers"),
        # the layer of a first stage that does not run is refused (it was ignored)
        ({"candidates": "all", "candidate_layer": 1}, "candidate_layer=1 needs candidates"),
        # the official draws need one prompt length per batch
        ({"draw_order": "sideways"}, "draw_order='sideways': expected one of batched, official"),
        ({"draw_order": "official", "batch_size": 2}, "draw_order=official needs batch_size=1 with method=prefilling"),
        # a temperature whose 1/T overflows float32, before the weights load
        ({"temperature": 1e-300}, "temperature must be a finite number >= 0, got 1e-300: 0 (greedy) or in [1.18e-38"),
        # int() and float() read other scripts' digits ('٣' is 3)
        ({"chunk_size": "٣"}, "chunk_size='٣': expected an integer >= 1"),
        ({"steps": "١٢"}, "steps='١٢': expected an integer >= 1"),
        ({"temperature": "٠.٥"}, "temperature='٠.٥': expected a finite number >= 0"),
        ({"chunk_size": "1_0"}, "chunk_size='1_0': expected an integer >= 1"),
        ({"anchor_token_id": 100}, "anchor_token_id=100: outside the model's vocabulary of 100"),
        ({"score_terms": "self_info+self_info"}, "expected each term once, got self_info more than once"),
        ({"gen_length": 2000}, "gen_length=2000 exceeds the model's 1536 trained positions"),
        ({"gen_length": 8, "block_length": 4, "steps": 3}, "steps=3 is not a multiple of the 2 blocks"),
        ({"pretrained": "/no/such/dir"}, "pretrained=/no/such/dir: no such directory"),
        ({"tokenizer": "/no/such/dir"}, "tokenizer=/no/such/dir: no such directory"),
        ({"device": "tpu"}, "device 'tpu' is not a device"),
        ({"device": "meta"}, "only cpu and cuda devices are supported"),
    ],
)
def test_model_args_errors_are_one_line_naming_the_key(kwargs, expected):
    assert expected in _error(kwargs)


def test_model_args_checks_need_no_weights(monkeypatch):
    """parse_model_args reads config.json and prefilling_config.json only: the values the model accepts pass
    with no weights file at all, and every error above is found the same way."""
    import dllm.model.loader

    monkeypatch.setattr(dllm, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    monkeypatch.setattr(dllm.model.loader, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    s = parse_model_args(
        {"chunk_size": 1535, "candidates": 8, "candidate_layer": -4, "anchor_token_id": 99, "gen_length": 1536}
    )
    assert (s.prefilling.chunk_size, s.prefilling.candidate_layer, s.prefilling.anchor_token_id) == (1535, -4, 99)
    assert parse_model_args(
        {"candidates": 8, "candidate_layer": 3, "score_terms": "self_info+pseudo_label"}
    ).prefilling.score_terms == (
        "self_info",
        "pseudo_label",
    )
    assert "candidate_layer=4" in _error({"candidates": 8, "candidate_layer": 4})


def test_describe_model_args_lists_every_key():
    text = describe_model_args()
    assert len(text.splitlines()) == len(MODEL_ARGS)
    for key in MODEL_ARGS:
        assert f"  {key} " in text


# ---------------------------------------------------------------- the local harness tasks' data


def test_local_task_files_equal_the_cases_dllm_eval_makes(model):
    for name, rows in (
        ("passkey.jsonl", passkey_rows(model.tokenizer)),
        ("passkey_choice.jsonl", choice_rows(model.tokenizer)),
    ):
        lines = (HARNESS_DIR / name).read_text(encoding="utf-8").splitlines()
        assert [json.loads(x) for x in lines] == rows, f"{name} is stale: python -m tests.harness_cases"
    choice = choice_rows(model.tokenizer)
    assert all(len(set(r["choices"])) == 3 and all(len(c) == 5 for c in r["choices"]) for r in choice)


# ---------------------------------------------------------------- prefix / context / query


def test_split_by_the_context_field_equals_dllm_eval_inputs(model):
    case = make_case("passkey", 512, 0.5, 3, tokenizer=model.tokenizer)
    doc = {"context": case.context, "answer": case.answer}
    parts, rule = split_request(model, case.prompt, doc)
    ref = case_inputs(model, case, "prefilling")["prompt"]
    assert rule == "field"
    for got, want in ((parts.prefix, ref.prefix), (parts.context, ref.context), (parts.query, ref.query)):
        assert torch.equal(got, want)
    assert parts.prefix[0].item() == model.tokenizer.bos_token_id


def test_split_field_takes_the_last_occurrence_and_other_field_names(model):
    ctx = "The pass key is 12345. " * 8
    text = f"Example: {ctx}\n\nNow: {ctx}\n\nWhat is the pass key?"
    parts, rule = split_request(model, text, {"passage": ctx}, context_field="passage")
    assert rule == "field"
    assert model.tokenizer.decode(parts.prefix[1:].tolist()) == f"Example: {ctx}\n\nNow: "
    assert model.tokenizer.decode(parts.query.tolist()) == "\n\nWhat is the pass key?"


def test_split_falls_back_to_the_last_paragraph_then_the_last_tokens(model):
    body = "The grass is green. The sky is blue. " * 10
    text = body + "\n\nWhat is the pass key? The pass key is "
    # a field that is absent, not a string, or not in the prompt: rule 2
    for doc in (None, {}, {"context": 7}, {"context": "not in the prompt"}):
        parts, rule = split_request(model, text, doc)
        assert rule == "paragraph"
        assert parts.prefix.tolist() == [model.tokenizer.bos_token_id]
        assert model.tokenizer.decode(parts.context.tolist()) == body + "\n\n"
        assert model.tokenizer.decode(parts.query.tolist()) == "What is the pass key? The pass key is "
    # a context field with nothing after it (no query) is no split either
    assert split_request(model, text, {"context": "The pass key is "})[1] == "paragraph"
    # no blank line: the last 64 tokens (or query_window) are the query
    parts, rule = split_request(model, body, None)
    assert rule == "tokens" and parts.query.numel() == 64 and parts.context.numel() == len(body) - 64
    parts, rule = split_request(model, body, None, query_window=10)
    assert parts.query.numel() == 10
    # a last paragraph longer than the rest is not a query: tokens again
    assert split_request(model, "Short.\n\n" + body, None)[1] == "tokens"


def test_split_without_bos_and_too_short(model):
    parts, _ = split_request(model, "a b c\n\nquery?", None, add_bos=False, query_window=2)
    assert parts.prefix.numel() == 0
    with pytest.raises(ValueError, match="too short to split off a 64-token query"):
        split_request(model, "What is the pass key?", None)


# ---------------------------------------------------------------- the Monte Carlo log-likelihood


class _Stub:
    """A stand-in DiffusionLM whose logits are given by ``table(x, col)`` -> ``[V]`` for live column ``col``
    of the (noised) sequence ``x`` ([N] ids): a closed-form model to check the estimator against."""

    def __init__(self, vocab, table):
        self.config = SimpleNamespace(vocab_size=vocab)
        self.mask_token_id = vocab - 1
        self.device = torch.device("cpu")
        self.table = table
        self.calls = 0

    def __call__(self, x, positions, *, logits_at):
        self.calls += 1
        out = torch.stack([torch.stack([self.table(row, int(c)) for c in cols]) for row, cols in zip(x, logits_at)])
        return SimpleNamespace(logits=out)


def _independent_table(vocab):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(64, vocab, generator=g)
    return lambda x, col: logits[col]


def test_estimator_is_unbiased_for_a_model_that_ignores_the_other_continuation_tokens():
    vocab = 11
    table = _independent_table(vocab)
    stub = _Stub(vocab, table)
    ctx, cont = [0, 4, 2], [7, 1, 1, 9, 3]
    exact = sum(torch.log_softmax(table(None, 3 + i), -1)[t].item() for i, t in enumerate(cont))
    # closed form: for such a model the ELBO is the exact log-likelihood (the 1/t weight undoes the masking rate)
    elbo, var_by_l = _exact_elbo(table, stub.mask_token_id, ctx, cont)
    assert elbo == pytest.approx(exact, abs=1e-6)
    assert var_by_l[len(cont)] == pytest.approx(0.0, abs=1e-9)  # all masked: one value
    got, se = _estimate(stub, ctx, cont, var_by_l, samples=5 * 40, batch_size=64, seed=1)
    assert stub.calls == 4  # ceil(200 / 64) forwards
    assert se > 0.05 and abs(got - exact) < 4.5 * se, (got, exact, se)


def _estimate(stub, ctx, cont, var_by_l, *, samples, batch_size, seed):
    """The estimator on token lists ``ctx``/``cont`` (seeded), and the standard error of the stratified mean
    (every l drawn samples / L times, weight 1/L each) that it should land within."""
    got = masked_diffusion_loglikelihood(
        stub,
        torch.tensor(ctx),
        torch.tensor(cont),
        samples=samples,
        batch_size=batch_size,
        generator=torch.Generator().manual_seed(seed),
    )
    n = len(var_by_l)
    return got, math.sqrt(sum(v / n**2 / (samples / n) for v in var_by_l.values()))


def _interacting_table(vocab, mask_id):
    """Logits of column c depend on how many continuation tokens (columns >= 2) are still masked."""
    g = torch.Generator().manual_seed(11)
    base = torch.randn(64, vocab, generator=g)
    tilt = torch.randn(64, vocab, generator=g)

    def table(x, col):
        masked = int((x[2:] == mask_id).sum())
        return base[col] + 0.7 * masked * tilt[col]

    return table


def _exact_elbo(table, mask_id, ctx, cont):
    """Brute force over every masked subset: E_l E_{|M|=l} [(L/l) sum_{i in M} log p(x_i | x_M masked)] with l
    uniform on 1..L; returns the mean and, per l, the variance of one sample's value."""
    n = len(cont)
    mean, var_by_l = 0.0, {}
    for lcount in range(1, n + 1):
        vals = []
        for subset in itertools.combinations(range(n), lcount):
            x = torch.tensor(ctx + [mask_id if i in subset else t for i, t in enumerate(cont)])
            s = sum(torch.log_softmax(table(x, len(ctx) + i), -1)[cont[i]].item() for i in subset)
            vals.append(s * n / lcount)
        m = sum(vals) / len(vals)
        mean += m / n
        var_by_l[lcount] = sum((v - m) ** 2 for v in vals) / len(vals)
    return mean, var_by_l


def test_estimator_matches_the_enumerated_elbo_within_its_standard_error():
    vocab = 9
    stub = _Stub(vocab, None)
    stub.table = _interacting_table(vocab, stub.mask_token_id)
    ctx, cont = [0, 3], [5, 2, 6, 1]
    exact, var_by_l = _exact_elbo(stub.table, stub.mask_token_id, ctx, cont)
    # samples: a multiple of L, every l is drawn 60 times (stratified)
    got, se = _estimate(stub, ctx, cont, var_by_l, samples=4 * 60, batch_size=48, seed=0)
    assert se > 0.01  # the subsets matter: the check below is not vacuous
    assert abs(got - exact) < 4.5 * se, (got, exact, se)
    # a different estimator (mask every token with an independent coin) would miss: the ELBO is not sum log p
    all_masked = torch.tensor(ctx + [stub.mask_token_id] * len(cont))
    one_forward = sum(torch.log_softmax(stub.table(all_masked, 2 + i), -1)[t].item() for i, t in enumerate(cont))
    assert abs(one_forward - exact) > 10 * se


def test_single_token_continuation_equals_one_masked_forward(model):
    ctx = dllm.encode_text(
        model, "The pass key is 12345. Remember it. What is the pass key? The pass key is ", bos=True
    )
    for digit in "13":
        cont = dllm.encode_text(model, digit)
        got = masked_diffusion_loglikelihood(model, ctx, cont, samples=3, batch_size=2)
        x = torch.cat([ctx, torch.tensor([model.mask_token_id])])[None]
        logits = model(x, torch.arange(x.shape[1])).logits
        ref = torch.log_softmax(logits[0, -1].float(), -1)[cont[0]].item()
        assert got == pytest.approx(ref, abs=1e-5)


def test_tiny_model_prefers_the_gold_key(model):
    row = choice_rows(model.tokenizer)[0]
    ctx = dllm.encode_text(model, row["prompt"], bos=True)
    g = torch.Generator().manual_seed(0)
    lls = [
        masked_diffusion_loglikelihood(model, ctx, dllm.encode_text(model, c), samples=5, generator=g)
        for c in row["choices"]
    ]
    assert max(range(3), key=lls.__getitem__) == row["label"]
    assert lls[row["label"]] > max(v for i, v in enumerate(lls) if i != row["label"]) + 1.0


def test_estimator_errors(model):
    ctx = dllm.encode_text(model, "abc", bos=True)
    with pytest.raises(ValueError, match="continuation is empty"):
        masked_diffusion_loglikelihood(model, ctx, ctx[:0])
    with pytest.raises(ValueError, match="mask token"):
        masked_diffusion_loglikelihood(model, ctx, torch.tensor([model.mask_token_id]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        masked_diffusion_loglikelihood(model, ctx, torch.tensor([10_000]))
    with pytest.raises(ValueError, match="1-D int64"):
        masked_diffusion_loglikelihood(model, ctx, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="samples and batch_size"):
        masked_diffusion_loglikelihood(model, ctx, ctx, samples=0)


def test_model_args_chunk_size_keeps_the_checkpoints_snap_as_a_share_of_the_chunk():
    # the bundled file snaps within 64 of 256 tokens; chunk_size=64 alone must not trip boundary_snap < C
    assert parse_model_args({"chunk_size": 64}).prefilling.boundary_snap == 16
    assert parse_model_args({"chunk_size": 64, "boundary_snap": 0}).prefilling.boundary_snap == 0
