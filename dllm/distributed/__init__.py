"""Chunk-parallel Prefilling-dLLM over ``torch.distributed``: one document's chunks encoded and scored
on several processes (gloo on CPUs, NCCL on GPUs with one device per rank).

Chunks are encoded independently (Prefilling-dLLM, arXiv 2606.10537: every chunk is ``BOS + its
tokens`` at local positions), so the chunked prefill splits across ranks with no exchange at all,
unlike context parallelism in autoregressive engines (ring attention exchanges K/V at every layer).
Selection needs one score per chunk and the K/V of the K kept chunks only. The data flow, our
extension of the paper's method::

    every rank: cut the whole document into chunks (fixed, or snapped to sentence ends)
    rank r:  encode chunks [lo_r, hi_r)           (dllm.encode_document of its token span)
    root:    draft pseudo-labels (prefix + query, no context) -> broadcast query window + draft
    rank r:  first stage of its chunks (with candidates)      -> all_gather; the top candidates
    rank r:  score its (candidate) chunks (score_chunks)      -> all_gather the scores
    all:     top-K of the gathered scores, redundancy-aware if asked (the same tensor everywhere: the same choice)
    owners:  send the kept chunks' K/V (and token ids) to the root, which decodes

The scoring tokens' own per-layer K/V are not broadcast: in a scoring pass they attend to the chunk
bidirectionally, so from the second layer on they depend on the chunk and each rank computes them in
its own scoring forward, exactly as one process does. What crosses ranks is the query window and
the draft (a few integers), ``N`` first-stage and ``3 N`` predictive fp32 scores, the chunks' token ids (with
``redundancy_threshold``, once per document) and the K kept chunks' K/V:
``2 * layers * (C + 1) * Hkv * D * elt`` bytes each (:func:`kept_kv_bytes`).

Equality with one process: every rank cuts the same chunks (the boundaries, snapped or not, are those of
the whole token sequence), a chunk's K/V and its scores depend on that chunk alone, and the chunks of
one forward do not interact (a chunk is one batch row), so on the CPU the sharded cache, the first-stage and
predictive scores, the kept chunks and the generated tokens equal a single-process run bit for bit, at the
bundled defaults too (tests/test_distributed.py: 2 and 3 gloo ranks; one exception:
a rank holding a single chunk scores it in a one-row forward, whose scores agree to ~1e-7, not bits); on GPUs
a different batch composition may change them at round-off level (cuBLAS picks kernels by shape).

API (every rank calls each function, collectively; ``group`` None = the default group, and without
an initialised process group everything runs in this one process)::

    doc = dllm.distributed.encode_document(model, ids, prefilling=cfg)     # ShardedDocument
    doc.save("doc.idx")                          # doc.idx + doc.idx.00000-of-00002.safetensors, ...
    doc = dllm.distributed.ShardedDocument.load("doc.idx", model)           # any world size <= N
    res = dllm.distributed.generate(model, doc, PromptParts(prefix, None, query), prefilling=cfg)
    # res: the GenerationResult on the root rank, None elsewhere
    full = doc.gather()                          # the whole DocumentCache on the root, None elsewhere
    whole = dllm.distributed.load_document("doc.idx", model)  # one process, no group: the whole DocumentCache

Errors: every collective step runs under :func:`run_on_all`: an exception on any rank is exchanged
and every rank raises the same :class:`RankError` naming the first failing rank, so no rank waits
forever for a peer that failed. A rank that dies (killed) makes its peers' next collective fail with
the backend's error (gloo: at once, a closed connection; NCCL: after the process group's timeout).

Rooms: :mod:`~dllm.distributed.group` (the process group, :func:`run_on_all`, :func:`read_on_root`),
:mod:`~dllm.distributed.shares` (which rank holds which chunks), :mod:`~dllm.distributed.sharded_document`
(:class:`ShardedDocument` and its collectives), :mod:`~dllm.distributed.index_file` (its files),
:mod:`~dllm.distributed.encoding`, :mod:`~dllm.distributed.selection`, :mod:`~dllm.distributed.generation`,
:mod:`~dllm.distributed.single_process` (a saved document of either kind read in one process).

Launch from the command line: ``torchrun --nproc-per-node N -m dllm encode ...`` and
``torchrun ... -m dllm generate --document doc.idx ...`` (:mod:`dllm.cli.distributed`).
"""

from dllm.distributed.encoding import encode_document
from dllm.distributed.generation import generate
from dllm.distributed.group import DEFAULT_TIMEOUT_S, RankError, init_from_env, read_on_root, run_on_all
from dllm.distributed.index_file import INDEX_FIELDS, INDEX_FORMAT, INDEX_KIND, read_index
from dllm.distributed.selection import score_and_select
from dllm.distributed.sharded_document import ShardedDocument, kept_kv_bytes
from dllm.distributed.shares import shard_bounds
from dllm.distributed.single_process import load_document, read_document_header

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "INDEX_FIELDS",
    "INDEX_FORMAT",
    "INDEX_KIND",
    "RankError",
    "ShardedDocument",
    "encode_document",
    "generate",
    "init_from_env",
    "kept_kv_bytes",
    "load_document",
    "read_document_header",
    "read_index",
    "read_on_root",
    "run_on_all",
    "score_and_select",
    "shard_bounds",
]
