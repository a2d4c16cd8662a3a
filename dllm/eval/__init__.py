"""Evaluation: seeded retrieval tasks, LongBench files, running cases and writing their CSV rows.

Modules and packages: :mod:`~dllm.eval.tasks` (seeded InfiniteBench-style cases: passkey, number_string,
kv_retrieval, needle, word_fact, with their wording in ``tasks/wording.json``), :mod:`~dllm.eval.longbench`
(local LongBench JSONL files and their metrics), :mod:`~dllm.eval.evaluation` (one case through
:func:`dllm.generate`, accuracy tables, CSV rows) and :mod:`~dllm.eval.provenance` (device, versions, git
commit and date of every recorded row). The lm-evaluation-harness model lives in :mod:`dllm.harness`, beside
this package (``python -m dllm.harness``).

Imports: :mod:`dllm.generate`, :mod:`dllm.prefilling`, :mod:`dllm.model` and the standard library; never
:mod:`dllm.cli` (which imports this package).
"""
