"""Instruct prompts: the tokenizer's chat template around the question, the context inside the user turn,
only the context chunked. Expected texts are Qwen2's ChatML layout written out by hand."""

import json

import pytest

import dllm
from dllm.cli import main
from dllm.prefilling import PrefillingConfig, split_prompt
from dllm.prefilling.prompt import render_chat
from tests.tiny_checkpoints import checkpoint_fixtures, write_real_dream_checkpoint

pytestmark = pytest.mark.compat

USER = "Read the notes.\n\n{context}\n\nWhat is the code?"
CONTEXT = "The grass is green. The code is 4417. " * 10
SYSTEM_DEFAULT = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


real_dream_dir, model = checkpoint_fixtures(
    write_real_dream_checkpoint, seed=5, folder="real_dream_chat", dir_fixture="real_dream_dir"
)


def _text(model, ids):
    return model.tokenizer.decode(ids.tolist())


def test_chat_parts_put_the_context_inside_the_user_turn(model):
    parts = split_prompt(model, USER, context=CONTEXT, apply_chat_template=True)
    assert _text(model, parts.prefix) == SYSTEM_DEFAULT + "<|im_start|>user\nRead the notes.\n\n"
    assert _text(model, parts.context) == CONTEXT
    assert _text(model, parts.query) == "\n\nWhat is the code?<|im_end|>\n<|im_start|>assistant\n"
    # the three parts are exactly the template's rendering of the whole user message
    rendered = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": USER.replace("{context}", CONTEXT)}], tokenize=False, add_generation_prompt=True
    )
    assert _text(model, parts.full()) == rendered
    assert int(parts.prefix[0]) == model.tokenizer.convert_tokens_to_ids("<|im_start|>")  # the template decides


def test_system_message(model):
    parts = split_prompt(model, USER, context=CONTEXT, apply_chat_template=True, system="Be brief.")
    assert (
        _text(model, parts.prefix) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nRead the notes.\n\n"
    )


def test_prefilling_chunks_only_the_context(model):
    parts = split_prompt(model, USER, context=CONTEXT, apply_chat_template=True)
    cfg = PrefillingConfig(chunk_size=16, top_k=2)
    res = dllm.generate(model, method="prefilling", prompt=parts, prefilling=cfg, gen_length=4, steps=2)
    n_ctx = len(model.tokenizer(CONTEXT, add_special_tokens=False)["input_ids"])
    assert res.stats.extra["num_chunks"] == -(-n_ctx // 16)
    # cache: the chat prefix + 2 chunks of at most 16 tokens, each with its anchor
    assert res.stats.extra["cached_tokens"] <= parts.prefix.numel() + 2 * 17


def test_chat_errors(model):
    with pytest.raises(ValueError, match="needs a context and one"):
        split_prompt(model, "no slot here", context=CONTEXT, apply_chat_template=True)
    with pytest.raises(ValueError, match="needs a context and one"):
        split_prompt(model, USER, apply_chat_template=True)
    tiny = dllm.load_model(device="cpu")  # the bundled base model has no chat template
    with pytest.raises(ValueError, match="no chat template"):
        render_chat(tiny, "hi")


@pytest.mark.parametrize("method", ["prefilling", "dense"])
def test_cli_chat_flag(real_dream_dir, tmp_path, capsys, method):
    prompt, context = tmp_path / "prompt.txt", tmp_path / "context.txt"
    prompt.write_text(USER)
    context.write_text(CONTEXT)
    extra = ["--chunk-size", "16", "--top-k", "2"] if method == "prefilling" else []
    argv = ["generate", "--model", real_dream_dir, "--prompt-file", str(prompt), "--context-file", str(context)]
    rc = main([*argv, "--chat", "--method", method, "--gen-length", "4", "--steps", "2", "--stats", "json", *extra])
    assert rc == 0
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    if method == "prefilling":
        m = dllm.load_model(real_dream_dir, device="cpu")
        n_ctx = len(m.tokenizer(CONTEXT, add_special_tokens=False)["input_ids"])
        assert stats["num_chunks"] == -(-n_ctx // 16) and stats["anchor_token_id"] == 151665
