"""lm-evaluation-harness support: the ``prefilling-dllm`` model and ``python -m dllm.harness``.

``pip install -e .[harness]`` installs lm-eval 0.4.x (and ``.[longbench]`` the packages the LongBench tasks'
metrics import: jieba, fuzzywuzzy, rouge). Then::

    python -m dllm.harness --model prefilling-dllm \\
        --model_args pretrained=/path/to/Dream-v0-Instruct-7B,method=prefilling,chunk_size=1024,top_k=4 \\
        --tasks longbench_qasper --batch_size 4

runs the harness's own command line (:func:`dllm.harness.cli.main`) with the model registered. In Python,
``import dllm.harness.model`` registers it (lm-eval has no plugin discovery for models: a model class
is known once the module that decorates it with ``lm_eval.api.registry.register_model`` is imported).

Modules: :mod:`~dllm.harness.args` (the ``--model_args`` keys and their checks), :mod:`~dllm.harness.split`
(prefix / context / query of a prompt), :mod:`~dllm.harness.likelihood` (the Monte Carlo log-likelihood),
:mod:`~dllm.harness.model` (the model class; imports lm-eval), :mod:`~dllm.harness.cli` (the entry point).
Only ``model`` and ``cli`` need lm-eval.
"""

MODEL_NAME = "prefilling-dllm"
