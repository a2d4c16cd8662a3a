"""The denoising runtime that every method decodes with, and that Prefilling-dLLM builds on.

Modules: :mod:`~dllm.decode.policies` (dense, prefix cache and the prefilling policy's base: what each step
recomputes and what it reads from a static KV cache), :mod:`~dllm.decode.denoise` (the semi-autoregressive
loop), :mod:`~dllm.decode.block_cache` (a step that recomputes the current block only, over cached K/V of the
rest of the live block), :mod:`~dllm.decode.unmasking` (Dream's and LLaDA's rules for which masked tokens to
reveal), :mod:`~dllm.decode.step_graph` (a decode step replayed from a CUDA graph) and
:mod:`~dllm.decode.timer` (seconds per phase).

Imports: :mod:`dllm.model` and ``triton_kernels`` only (:mod:`dllm.prefilling` imports this package, and
:mod:`dllm.generate` puts the two together).
"""
