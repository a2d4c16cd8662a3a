"""The prefilling-dllm model inside lm-evaluation-harness (offline, the local tasks of tests/data/harness/).

Needs lm-eval (``pip install -e .[harness]``; ``make test-harness``); skipped without it.
"""

import csv
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import dllm  # noqa: E402
from dllm.cli import main as dllm_main  # noqa: E402
from dllm.eval.evaluation import case_inputs  # noqa: E402
from dllm.generate import PositionWindowWarning  # noqa: E402
from dllm.harness.args import ModelArgsError  # noqa: E402
from dllm.harness.cli import main as harness_main  # noqa: E402
from dllm.harness.model import MODEL_NAME, PrefillingDLLM, cut_at_stops, fit_top_k  # noqa: E402
from dllm.prefilling import PrefillingConfig  # noqa: E402
from tests.harness_cases import HARNESS_DIR, PASSKEY_GRID  # noqa: E402

pytestmark = pytest.mark.harness
REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
PREFILLING = {"method": "prefilling", "chunk_size": 128, "top_k": 2}  # 512-token contexts: 4 chunks, 2 kept


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def _dllm_eval(tmp_path, method: str, *flags) -> list[dict]:
    """``dllm eval passkey`` on the local task's cases; its CSV rows."""
    g = PASSKEY_GRID
    out = tmp_path / f"eval_{method}.csv"
    argv = ["eval", "passkey", "--lengths", *map(str, g["lengths"]), "--depths", *map(str, g["depths"])]
    argv += ["--samples", str(g["n"]), "--seed-base", str(g["seed"]), "--method", method, *flags, "--out", str(out)]
    assert dllm_main(argv) == 0
    with open(out, newline="") as f:
        return list(csv.DictReader(f))


def _samples(folder: Path, task: str) -> list[dict]:
    (path,) = folder.rglob(f"samples_{task}_*.jsonl")
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return sorted(rows, key=lambda r: r["doc_id"])


def test_harness_cli_on_the_local_passkey_task_equals_dllm_eval(tmp_path):
    """``python -m dllm.harness`` on a local task, offline on the bundled model: the harness prints its results
    table, and every answer (batched 3 at a time) equals ``dllm eval passkey`` (one case at a time) on the same
    cases and config."""
    args = ",".join(f"{k}={v}" for k, v in PREFILLING.items())
    cmd = [sys.executable, "-m", "dllm.harness", "--model", MODEL_NAME, "--model_args", args, "--tasks", "dllm_passkey"]
    cmd += ["--include_path", str(HARNESS_DIR), "--batch_size", "3", "--log_samples", "--output_path", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = [x for x in proc.stdout.splitlines() if x.startswith("|")]
    assert "Metric" in table[0] and "dllm_passkey" in table[2] and "exact_match" in table[2], proc.stdout
    samples = _samples(tmp_path, "dllm_passkey")
    rows = _dllm_eval(tmp_path, "prefilling", "--chunk-size", "128", "--top-k", "2")
    assert len(samples) == len(rows) == 3
    assert [s["resps"][0][0] for s in samples] == [r["answer"] for r in rows]
    assert [s["target"] for s in samples] == [r["gold"] for r in rows]
    assert [s["exact_match"] for s in samples] == [float(r["correct"] == "True") for r in rows]
    value = float(table[2].split("|")[7])
    assert value == pytest.approx(sum(r["correct"] == "True" for r in rows) / 3)


def test_dense_through_simple_evaluate_equals_dllm_eval(tmp_path):
    res = lm_eval.simple_evaluate(
        model=MODEL_NAME,
        model_args={"method": "dense"},
        tasks=["dllm_passkey"],
        task_manager=TaskManager(include_path=str(HARNESS_DIR)),
        log_samples=True,
        device="cpu",
        batch_size=2,
    )
    samples = sorted(res["samples"]["dllm_passkey"], key=lambda r: r["doc_id"])
    rows = _dllm_eval(tmp_path, "dense")
    assert [s["resps"][0][0] for s in samples] == [r["answer"] for r in rows]
    accuracy = sum(r["correct"] == "True" for r in rows) / 3
    assert res["results"]["dllm_passkey"]["exact_match,first_integer"] == pytest.approx(accuracy)


def test_multiple_choice_ranks_the_gold_key_first():
    res = lm_eval.simple_evaluate(
        model=MODEL_NAME,
        model_args={"method": "dense", "mc_samples": 5, "greedy_check": False, "seed": 0},
        tasks=["dllm_passkey_choice"],
        task_manager=TaskManager(include_path=str(HARNESS_DIR)),
        log_samples=True,
        device="cpu",
    )
    for s in res["samples"]["dllm_passkey_choice"]:
        lls = [r[0] for r in s["filtered_resps"]]
        gold = int(s["target"])
        assert max(range(len(lls)), key=lls.__getitem__) == gold, lls
    assert res["results"]["dllm_passkey_choice"]["acc,none"] == 1.0


# ---------------------------------------------------------------- the model class on hand-made requests


@pytest.fixture(scope="module")
def lm():
    return PrefillingDLLM(method="prefilling", chunk_size=64, mc_samples=4, seed=0)  # 8 chunks, the default K=4


def _gen(text, doc=None, **gen_kwargs):
    return Instance("generate_until", doc or {}, (text, gen_kwargs), 0)


CASES = [json.loads(x) for x in (HARNESS_DIR / "passkey.jsonl").read_text().splitlines()]


def test_generate_until_batches_equal_single_requests_and_honour_the_task(lm):
    reqs = [_gen(c["prefix"] + c["context"] + c["query"], c, max_gen_toks=9, until=[]) for c in CASES]
    # a shorter context (3 chunks, fewer than the default K=4: every chunk kept) and another gen length
    short = CASES[0]["prefix"] + CASES[0]["context"][:150] + CASES[0]["query"]
    reqs.append(_gen(short, {"context": CASES[0]["context"][:150]}, max_gen_toks=12, until=["7"]))
    batched = PrefillingDLLM(method="prefilling", chunk_size=64, batch_size=4).generate_until(reqs, disable_tqdm=True)
    singles = [lm.generate_until([r], disable_tqdm=True)[0] for r in reqs]
    assert batched == singles
    full = lm.generate_until([_gen(short, None, max_gen_toks=12, until=[])], disable_tqdm=True)[0]
    assert len(lm.model.tokenizer(full)["input_ids"]) <= 12
    assert batched[-1] == cut_at_stops(full, ["7"])
    for c, answer in zip(CASES, batched):
        ref = dllm.generate(
            lm.model,
            prompt=case_inputs(lm.model, _case(c), "prefilling")["prompt"],
            method="prefilling",
            gen_length=9,
            prefilling=lm.settings.prefilling,
        ).text[0]
        assert answer == ref


def _case(row):
    from types import SimpleNamespace

    return SimpleNamespace(**row)


def test_an_explicit_top_k_above_the_chunks_fails_before_any_decoding():
    lm = PrefillingDLLM(method="prefilling", chunk_size=128, top_k=8)  # 508 tokens: 4 fixed chunks, 5 snapped
    c = CASES[0]
    with pytest.raises(ValueError, match="top_k=8 exceeds the 5 chunk"):
        lm.generate_until([_gen(c["prefix"] + c["context"] + c["query"], c, max_gen_toks=9)], disable_tqdm=True)


def test_fit_top_k_and_stops():
    cfg = PrefillingConfig(chunk_size=100, top_k=4)
    assert fit_top_k(cfg, 5, 450, explicit=True) is cfg
    assert fit_top_k(cfg, 3, 250, explicit=False).top_k is None
    with pytest.raises(ValueError, match="top_k=4 exceeds the 3 chunk"):
        fit_top_k(cfg, 3, 250, explicit=True)
    assert cut_at_stops("12345\n\nQ: more", ["\n\n", "Q:"]) == "12345"
    assert cut_at_stops("12345", ["", "9"]) == "12345"


def test_loglikelihood_is_greedy_and_rolling(lm):
    row = json.loads((HARNESS_DIR / "passkey_choice.jsonl").read_text().splitlines()[1])
    reqs = [Instance("loglikelihood", {}, (row["prompt"], c), i) for i, c in enumerate(row["choices"])]
    out = lm.loglikelihood(reqs, disable_tqdm=True)
    assert [g for _, g in out] == [i == row["label"] for i in range(3)]
    assert max(range(3), key=lambda i: out[i][0]) == row["label"]
    # the continuation's ids are cut from the whole prompt's: a trailing space stays with the context here
    ctx, cont = lm._encode_pair(row["prompt"], "12345")
    assert lm.model.tokenizer.decode(cont.tolist()) == "12345"
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("text",), 0)])


def test_loglikelihood_of_a_request_does_not_depend_on_the_requests_before_it():
    """With ``seed``, one generator for the whole run made a request's score depend on how many masks the
    requests before it drew; now each request seeds its own."""
    row = json.loads((HARNESS_DIR / "passkey_choice.jsonl").read_text().splitlines()[1])
    reqs = [Instance("loglikelihood", {}, (row["prompt"], c), i) for i, c in enumerate(row["choices"])]
    model = PrefillingDLLM(method="dense", mc_samples=3, seed=5, greedy_check=False)
    together = model.loglikelihood(reqs, disable_tqdm=True)
    alone = PrefillingDLLM(method="dense", mc_samples=3, seed=5, greedy_check=False).loglikelihood(
        reqs[2:], disable_tqdm=True
    )
    assert alone[0][0] == together[2][0]
    other_seed = PrefillingDLLM(method="dense", mc_samples=3, seed=6, greedy_check=False).loglikelihood(
        reqs[2:], disable_tqdm=True
    )
    assert other_seed[0][0] != together[2][0]  # the seed still matters


def test_loglikelihood_caps_copies_per_forward_and_warns_past_the_window(monkeypatch):
    """A long context's copies are not stacked past ``mc_batch_tokens`` tokens a forward (32 copies of a 100K
    context would need ~121 GB of MLP activations for Dream-7B), and a request past the trained positions
    gets the window warning that generation gives."""
    model = PrefillingDLLM(method="dense", mc_samples=4, mc_batch_tokens=3000, seed=0, greedy_check=False)
    widths = []
    forward = model.model.forward
    monkeypatch.setattr(model.model, "forward", lambda x, *a, **k: widths.append(tuple(x.shape)) or forward(x, *a, **k))
    context = "The grass is green. " * 60  # the bundled tokenizer: about one token a character
    ctx_ids, cont_ids = model._encode_pair(context, " 12345")
    tokens = ctx_ids.numel() + cont_ids.numel()
    assert 1000 < tokens <= 1536  # inside the bundled model's window
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no window warning here
        model.loglikelihood([Instance("loglikelihood", {}, (context, " 12345"), 0)], disable_tqdm=True)
    assert widths == [(3000 // tokens, tokens), (4 - 3000 // tokens, tokens)]
    widths.clear()
    long_context = "The grass is green. " * 90
    with pytest.warns(PositionWindowWarning, match="past the model's 1536 trained positions"):
        model.loglikelihood([Instance("loglikelihood", {}, (long_context, " 12345"), 0)], disable_tqdm=True)
    assert all(b == 1 for b, _ in widths) and len(widths) == 4


# ---------------------------------------------------------------- model_args errors through the entry point


@pytest.mark.parametrize(
    "model_args, expected",
    [
        ("chunk=128", "error: model_args: unknown key(s) chunk (did you mean chunk_size?)"),
        ("chunk_size=abc", "error: model_args chunk_size='abc': expected an integer >= 1"),
        ("method=dense,top_k=2", "error: model_args: top_k (method=prefilling): not an option of method=dense"),
        ("pretrained=/no/such/dir", "error: model_args pretrained=/no/such/dir: no such directory"),
        ("chunk_size=4096", "error: model_args chunk_size=4096: a chunk and its BOS anchor take 4097 positions"),
        # lm-eval's parser reads '٣' as 3; the text is checked before it types it
        ("method=dense,steps=٣", "error: model_args steps='٣': expected ASCII digits (0-9)"),
        ("draw_order=sideways", "error: model_args draw_order='sideways': expected one of batched, official"),
        ("candidates=all,candidate_layer=1", "error: model_args: candidate_layer=1 needs candidates"),
    ],
)
def test_model_args_errors_are_one_line_exit_2(capsys, model_args, expected):
    argv = ["--model_args", model_args, "--tasks", "dllm_passkey", "--include_path", str(HARNESS_DIR)]
    assert harness_main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and err[0].startswith(expected), err


def test_create_from_arg_string_refuses_other_digits_and_takes_draw_order():
    """simple_evaluate(model_args="...") builds the model through create_from_arg_string, whose lm-eval
    parser reads 'chunk_size=٣' as the int 3: refused first; draw_order reaches generate's keywords."""
    with pytest.raises(ModelArgsError, match="model_args chunk_size='٣': expected ASCII digits"):
        PrefillingDLLM.create_from_arg_string("method=prefilling,chunk_size=٣")
    lm = PrefillingDLLM.create_from_arg_string("method=dense,draw_order=official", {"device": "cpu"})
    assert lm.settings.generate_kwargs()["draw_order"] == "official"


def test_device_error_and_help_model_args(capsys):
    if not torch.cuda.is_available():
        with pytest.raises(ModelArgsError, match="CUDA is not available on this machine"):
            PrefillingDLLM(device="cuda:0")
    assert harness_main(["--help-model-args"]) == 0
    out = capsys.readouterr().out
    assert "chunk_size" in out and "mc_samples" in out


def test_chat_template_prompts_get_no_extra_bos():
    lm = PrefillingDLLM(method="prefilling", chunk_size=64)
    lm.model.tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    c = CASES[0]
    text = lm.apply_chat_template([{"role": "user", "content": c["prefix"] + c["context"] + c["query"]}])
    assert text.startswith("<user>" + c["prefix"]) and text.endswith(c["query"] + "<assistant>")
    job = lm._job(0, _gen(text, c, max_gen_toks=9))
    assert lm.model.tokenizer.decode(job.inputs.prefix.tolist()) == "<user>" + c["prefix"]  # no BOS before it
    assert job.inputs.prefix[0].item() != lm.model.tokenizer.bos_token_id
    assert lm.model.tokenizer.decode(job.inputs.query.tolist()) == c["query"] + "<assistant>"
    lm.model.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        lm.apply_chat_template([{"role": "user", "content": "hi"}])


def test_longbench_without_its_packages_is_one_error_line(capsys, monkeypatch):
    """The README's LongBench example without jieba/fuzzywuzzy/rouge was a 79-line ImportError
    traceback. Now one line naming the install command: found from the task's name before the weights load,
    and, when the name does not say (the check bypassed here), from lm-eval's own ImportError."""
    import dllm.harness.cli as harness_cli

    monkeypatch.setitem(sys.modules, "jieba", None)  # as if not installed, whether it is or not
    want = "pip install -e '.[longbench]'"
    assert harness_main(["--tasks", "longbench_qasper", "--limit", "1"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "the 'jieba' package" in err[0] and err[0].endswith(want), err
    monkeypatch.setattr(harness_cli, "missing_task_package", lambda argv: None)
    assert harness_main(["--tasks", "longbench_qasper", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "the 'jieba' package" in lines[0] and lines[0].endswith(want), err
    assert "Traceback" not in err
