"""Loading real-layout checkpoints unattended and faithfully: no prompt, the tokenizer's BOS as the chunk anchor,
clear errors for damaged safetensors, tokenizers read on transformers 4.46.3 and 5.x.

The "real Dream" checkpoint is tiny and random but written with Dream-v0-Instruct-7B's own config.json
(``auto_map`` included, vocab 152064, bos = eos = pad = 151643) and its real Qwen2 tokenizer
(``<|beginoftext|>`` = 151665), vendored under tests/data/reference.
"""

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import transformers

import dllm
from dllm.model.config import ConfigError
from dllm.model.tokenization import save_portable_tokenizer
from dllm.model.weights import WeightError
from dllm.prefilling import PrefillingConfig, PromptParts
from tests.tiny_checkpoints import (
    DREAM_TOKENIZER,
    LLADA_BOS,
    checkpoint_fixtures,
    write_dream_checkpoint,
    write_llada_checkpoint,
    write_real_dream_checkpoint,
)

pytestmark = pytest.mark.compat

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DREAM_BOS, DREAM_MASK, DREAM_EOS = 151665, 151666, 151643  # tokenizer ids of Dream-v0 (added_tokens.json)
PROMPT = "Do you wish to run the custom code?"


real_dream_dir, real_dream = checkpoint_fixtures(
    write_real_dream_checkpoint, seed=3, folder="real_dream", dir_fixture="real_dream_dir"
)


# --- unattended loading, in a child process -------------------------------------------------

_LOAD_AND_PREFILL = textwrap.dedent(
    """
    import json, sys
    import dllm
    from dllm.prefilling import PrefillingConfig, PromptParts
    m = dllm.load_model(sys.argv[1], device="cpu")
    parts = PromptParts(
        dllm.encode_text(m, "Read the notes.", bos=True),
        dllm.encode_text(m, "The grass is green and the code is 4417. " * 12),
        dllm.encode_text(m, " What is the code?"),
    )
    res = dllm.generate(m, method="prefilling", prompt=parts, prefilling=PrefillingConfig(chunk_size=32, top_k=2),
                        gen_length=4, steps=2)
    print("RESULT " + json.dumps({"anchor": res.stats.extra["anchor_token_id"], "prefix0": int(parts.prefix[0]),
                                  "source": res.stats.extra["anchor_source"], "tok": type(m.tokenizer).__name__}))
    """
)


def _child_env():
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("TRUST_REMOTE_CODE", None)
    return env


def _result(out: str) -> dict:
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out[-3000:]
    return json.loads(line[len("RESULT ") :])


def _run_with_pty(args, timeout: float) -> tuple[int | None, str]:
    """Run ``args`` with a pseudo-terminal as stdin/stdout/stderr (what a user at a shell has); stop early
    when transformers' remote-code question shows (a prompt on a terminal waits forever). Returns
    (exit code or None if stopped, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=_child_env())
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                out += chunk
                if PROMPT.encode() in out:
                    return None, out.decode(errors="replace")
            elif proc.poll() is not None:
                break
        else:
            return None, out.decode(errors="replace") + "\n[timed out]"
        return proc.wait(timeout=30), out.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_real_dream_layout_loads_with_stdin_open_and_unanswered(real_dream_dir, tmp_path):
    """stdin is a pipe that stays open and is never written to: a prompt would block until the timeout."""
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LOAD_AND_PREFILL, real_dream_dir],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            cwd=REPO,
            env=_child_env(),
        )
        try:
            rc = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        finally:
            proc.stdin.close()
    text = out_path.read_text() + err_path.read_text()
    assert PROMPT not in text
    assert rc == 0, text[-3000:]
    got = _result(text)
    assert got == {"anchor": DREAM_BOS, "prefix0": DREAM_BOS, "source": "tokenizer", "tok": got["tok"]}
    assert got["tok"].startswith("Qwen2Tokenizer")


def test_real_dream_layout_loads_on_a_terminal(real_dream_dir):
    rc, text = _run_with_pty([sys.executable, "-c", _LOAD_AND_PREFILL, real_dream_dir], timeout=240)
    assert PROMPT not in text
    assert rc == 0, text[-3000:]
    assert _result(text)["anchor"] == DREAM_BOS


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="4.46's AutoTokenizer does not ask")
def test_the_terminal_harness_catches_the_prompt_autotokenizer_shows(real_dream_dir):
    """Guard for the test above: on transformers 5.x, AutoTokenizer on this very folder asks the question."""
    script = "import sys; from transformers import AutoTokenizer; AutoTokenizer.from_pretrained(sys.argv[1])"
    rc, text = _run_with_pty([sys.executable, "-c", script, real_dream_dir], timeout=240)
    assert rc is None and PROMPT in text


# --- the chunk anchor --------------------------------------------------------------------------


def _real_parts(model, n_ctx_repeat=8):
    return PromptParts(
        dllm.encode_text(model, "Notes:", bos=True),
        dllm.encode_text(model, "The sky is blue and the key is 771. " * n_ctx_repeat),
        dllm.encode_text(model, " What is the key?"),
    )


def test_anchor_is_the_tokenizers_bos_not_configs_eos(real_dream):
    assert real_dream.config.bos_token_id == DREAM_EOS  # what config.json says (also EOS and PAD)
    assert real_dream.tokenizer.bos_token_id == DREAM_BOS
    parts = _real_parts(real_dream)
    assert int(parts.prefix[0]) == DREAM_BOS  # the prompt's leading BOS
    res = dllm.generate(
        real_dream, method="prefilling", prompt=parts, prefilling=PrefillingConfig(chunk_size=16), gen_length=2
    )
    assert res.stats.extra["anchor_token_id"] == DREAM_BOS and res.stats.extra["anchor_source"] == "tokenizer"


def test_anchor_override_is_used_and_changes_the_chunk_keys(real_dream):
    parts = _real_parts(real_dream)
    kw = dict(method="prefilling", prompt=parts, gen_length=2, steps=1)
    cfg = PrefillingConfig(chunk_size=16, top_k=2, anchor_token_id=151644)
    res = dllm.generate(real_dream, prefilling=cfg, **kw)
    assert res.stats.extra["anchor_token_id"] == 151644
    assert res.stats.extra["anchor_source"] == "PrefillingConfig.anchor_token_id"
    # the anchor enters the chunk encodings: other anchors, other chunk scores
    base = dllm.generate(real_dream, prefilling=PrefillingConfig(chunk_size=16, top_k=2), **kw)
    assert base.stats.extra["all_chunk_scores"] != res.stats.extra["all_chunk_scores"]
    with pytest.raises(ValueError, match="mask token"):
        dllm.generate(real_dream, prefilling=PrefillingConfig(chunk_size=16, anchor_token_id=DREAM_MASK), **kw)


def test_anchor_falls_back_to_config_then_generation_config(tmp_path):
    write_dream_checkpoint(str(tmp_path / "dream"))  # no tokenizer; config.json bos 128
    write_llada_checkpoint(str(tmp_path / "llada"))  # bos only in generation_config.json
    for name, want in (("dream", 128), ("llada", LLADA_BOS)):
        model = dllm.load_model(str(tmp_path / name), device="cpu")
        g = torch.Generator().manual_seed(0)
        parts = PromptParts(torch.tensor([want]), torch.randint(0, 90, (20,), generator=g), torch.tensor([5, 6]))
        res = dllm.generate(
            model, method="prefilling", prompt=parts, prefilling=PrefillingConfig(chunk_size=8, top_k=2), gen_length=2
        )
        assert (res.stats.extra["anchor_token_id"], res.stats.extra["anchor_source"]) == (want, "config")


def test_input_ids_fallback_recognises_the_tokenizers_bos_as_prefix(real_dream):
    """A prompt given as input_ids: a leading tokenizer BOS becomes the 1-token prefix segment."""
    parts = _real_parts(real_dream, n_ctx_repeat=12)
    ctx = torch.cat([parts.context, parts.query])
    ids = torch.cat([torch.tensor([DREAM_BOS]), ctx])
    cfg = PrefillingConfig(chunk_size=32, top_k=None, query_window=8)
    res = dllm.generate(real_dream, ids[None], method="prefilling", prefilling=cfg, gen_length=2, steps=1)
    n_ctx = ctx.numel() - 8
    n_chunks = -(-n_ctx // 32)
    assert res.stats.extra["num_chunks"] == n_chunks
    assert res.stats.extra["cached_tokens"] == 1 + n_ctx + n_chunks  # BOS prefix + context + one anchor per chunk


# --- damaged safetensors -------------------------------------------------------------------------


def _damage(path, how):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write({"truncated": data[: len(data) // 2], "empty": b"", "corrupt": os.urandom(4096)}[how])


@pytest.mark.parametrize("how", ["truncated", "empty", "corrupt"])
def test_damaged_single_file_is_a_weight_error_naming_it(tmp_path, how):
    write_dream_checkpoint(str(tmp_path))
    path = str(tmp_path / "model.safetensors")
    _damage(path, how)
    with pytest.raises(WeightError) as e:
        dllm.load_model(str(tmp_path))
    assert path in str(e.value)


@pytest.mark.parametrize("how", ["truncated", "empty", "corrupt"])
def test_damaged_shard_is_a_weight_error_naming_that_shard(tmp_path, how):
    write_llada_checkpoint(str(tmp_path), shards=3)
    path = str(tmp_path / "model-00002-of-00003.safetensors")
    _damage(path, how)
    with pytest.raises(WeightError) as e:
        dllm.load_model(str(tmp_path))
    assert path in str(e.value) and "00001" not in str(e.value)


def test_truncated_real_dream_checkpoint(real_dream_dir, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(real_dream_dir, d)
    path = str(d / "model.safetensors")
    _damage(path, "truncated")
    with pytest.raises(dllm.WeightError, match="truncated or corrupt") as e:
        dllm.load_model(str(d))
    assert path in str(e.value)


# --- tokenizers ---------------------------------------------------------------------------------


def test_dream_tokenizer_known_ids():
    """Qwen2 BPE ids of two common words (the Qwen2 vocabulary: "Hello" 9707, " world" 1879)."""
    tok = dllm.load_tokenizer(DREAM_TOKENIZER, family="dream")
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [9707, 1879]
    assert (tok.bos_token_id, tok.mask_token_id, tok.eos_token_id) == (DREAM_BOS, DREAM_MASK, DREAM_EOS)
    assert tok.decode([9707, 1879]) == "Hello world"


def test_remote_code_tokenizer_class_is_never_run(tmp_path):
    """The real Hub folder names a remote class (DreamTokenizer) in auto_map; we read its files with the
    Qwen2 class instead, and its Python file is never imported."""
    d = tmp_path / "tok"
    shutil.copytree(DREAM_TOKENIZER, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "DreamTokenizer"
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    marker = tmp_path / "remote_code_ran"
    (d / "tokenization_dream.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    with pytest.warns(UserWarning, match="DreamTokenizer"):
        tok = dllm.load_tokenizer(str(d), family="dream")
    assert not marker.exists()
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [9707, 1879]
    assert tok.bos_token_id == DREAM_BOS
    os.remove(d / "vocab.json")
    with pytest.raises(ConfigError, match="never runs a checkpoint's own code"):
        dllm.load_tokenizer(str(d), family="dream")


def test_bundled_model_loads_with_its_tokenizer():
    """The bundled checkpoint on the installed transformers (also run on 4.46.3 by make test-compat)."""
    tiny = dllm.load_model(device="cpu")
    cfg = json.load(open(os.path.join(dllm.default_model_dir(), "tokenizer_config.json")))
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in cfg
    tok = tiny.tokenizer
    assert (tok.bos_token_id, tok.mask_token_id) == (tiny.config.bos_token_id, tiny.mask_token_id) == (1, 3)
    text = "pass key 42917\n!"
    ids = dllm.encode_text(tiny, text)
    assert ids.tolist() == [4 + 1 + ord(ch) - 32 if ch != "\n" else 4 for ch in text]  # one id per character
    assert tok.decode(ids.tolist()) == text


def test_save_portable_tokenizer_round_trip(tmp_path):
    tok = dllm.load_tokenizer(dllm.default_model_dir())
    save_portable_tokenizer(tok, str(tmp_path))
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in cfg
    again = dllm.load_tokenizer(str(tmp_path))
    assert again("abc 12")["input_ids"] == tok("abc 12")["input_ids"]
