"""The model layer: one network for both dLLM families, and everything that reads a checkpoint.

Modules: :mod:`~dllm.model.config` (``config.json`` -> :class:`ModelConfig`), :mod:`~dllm.model.rope` (RoPE and
its static scaling variants), :mod:`~dllm.model.modeling` (:class:`DiffusionLM`, the forward with or without a
static KV cache), :mod:`~dllm.model.merged_linear` (the fused path's merged q/k/v and gate/up weights),
:mod:`~dllm.model.kv_cache` (the slot pools that forward reads and writes, laid out as
``triton_kernels.split_s_attention`` takes them), :mod:`~dllm.model.weights` (safetensors checkpoints),
:mod:`~dllm.model.loader` (:func:`load_model`, :func:`load_tokenizer`), :mod:`~dllm.model.tokenization` (text <->
ids), :mod:`~dllm.model.devices`, :mod:`~dllm.model.hf` and
:mod:`~dllm.model.json_files` (small shared helpers).

Imports: ``triton_kernels``, torch, safetensors and transformers (tokenizers and RoPE initialisers only), and its
own modules; nothing else of ``dllm`` (the decode loop, prefilling, eval and the CLI build on this layer).
"""
