"""``python -m dllm encode``: the chunked prefill of a document, saved as a :class:`dllm.DocumentCache` that
``generate --document`` answers from without encoding the document again.

Imports: the other modules of :mod:`dllm.cli` except the command modules, the public API :mod:`dllm` and
:mod:`dllm.prefilling`.
"""

from __future__ import annotations

import os

from dllm.cli.args import (
    add_chunk_size,
    add_command,
    add_common_args,
    add_prefill_batch_and_snap,
    input_file,
)
from dllm.cli.files import read_document_to_encode
from dllm.cli.options import encode_config, note_unencodable, progress_bars, timed_load

# Every example runs as written on the bundled tiny model (tests/test_cli.py runs them from the help text).
EXAMPLES = ("python -m dllm encode --context-file doc.txt --out doc.cache",)
# what the examples' input files hold
EXAMPLE_FILES = """\
doc.txt as for generate. Answer questions from the saved cache without encoding the document again
(the prompt's {context} slot marks where the document goes; each --question fills its {question} slot):
  dllm generate --document doc.cache --prompt-file prompt.txt --gen-length 8"""
HELP = "encode a document once for later questions (a document cache)"  # in python -m dllm --help
DESCRIPTION = (
    "Chunked prefill of a document, saved as one safetensors file (a dllm.DocumentCache) that\n"
    "generate --document answers from without encoding the document again."
)


def cmd_encode(args) -> int:
    """``encode``: the chunked prefill of a document, saved as a :class:`dllm.DocumentCache` (under torchrun:
    one shard per rank and an index, :mod:`dllm.cli.distributed`)."""
    import dllm

    text = read_document_to_encode(args)
    cfg = encode_config(args)

    model, _ = timed_load(args)
    note_unencodable(model, text, f"--context-file {args.context_file}")
    doc = dllm.encode_document(model, dllm.encode_text(model, text), prefilling=cfg, progress=progress_bars())
    doc.save(args.out)
    print(
        f"wrote {args.out}: {len(doc)} tokens in {doc.num_chunks} chunks of {doc.chunk_size} "
        f"({os.path.getsize(args.out) / 2**20:.1f} MiB)"
    )
    return 0


def add_parser(sub, model_dir: str | None) -> None:
    """The ``encode`` subcommand of ``sub`` (its help shows the chunk size of ``model_dir``)."""
    c = add_command(sub, "encode", HELP, DESCRIPTION, EXAMPLES, EXAMPLE_FILES)
    c.add_argument("--context-file", type=input_file, required=True, help="UTF-8 document text, read as is")
    c.add_argument("--out", required=True, help="the cache file to write")
    add_chunk_size(c, model_dir)
    add_prefill_batch_and_snap(c, model_dir)
    add_common_args(c)
    c.set_defaults(func=cmd_encode)
