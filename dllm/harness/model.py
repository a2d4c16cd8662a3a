"""The lm-evaluation-harness model ``prefilling-dllm`` (importing this module registers it).

Requests (``lm_eval.api.instance.Instance``) and what answers them:

- ``generate_until``: :func:`dllm.generate` with the ``--model_args`` method, in batches of
  ``batch_size`` requests that share a gen length, temperature and (prefilling) config, or, for dense
  and prefix_cache, a prompt length. With ``method=prefilling`` each prompt is split into prefix /
  context / query by :func:`dllm.harness.split.split_request` (the dataset row's ``context`` field,
  else the last paragraph, else the last 64 tokens). The gen length is ``gen_length`` if given, else
  the task's ``max_gen_toks``, else 256; the temperature is ``temperature`` if given, else the task's
  when it asks for ``do_sample``, else 0 (greedy). A diffusion LM writes every response token at
  once, so the task's ``until`` strings cut the decoded text afterwards (at the first occurrence of
  any of them; the text is already cut at EOS).
- ``loglikelihood``: the masked-diffusion Monte Carlo ELBO of :mod:`dllm.harness.likelihood`
  (``mc_samples`` copies, ``mc_batch_size`` per forward, fewer when copies of a long context would pass
  ``mc_batch_tokens`` tokens a forward) over dense forwards of context + continuation (whatever ``method``
  says: the chunk selection of prefilling serves generation). Its cost is ``mc_samples`` dense forwards of
  the whole context per request: a log line says so for a context past ``mc_batch_tokens``. A request
  past the model's trained positions gets :class:`~dllm.generate.PositionWindowWarning`, as generation
  does. With ``seed``, each request draws its masks from its own generator, seeded by ``seed`` and the
  request's text: its score does not depend on the requests before it. ``is_greedy`` is whether greedy
  dense decoding of as many tokens as the continuation reproduces it (``greedy_check``).
- ``loglikelihood_rolling`` (perplexity tasks): not implemented (NotImplementedError).
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import defaultdict
from dataclasses import dataclass

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from dllm.generate import PositionWindowWarning
from dllm.harness.args import ModelArgsError, check_gen_length, check_model_args_text, parse_model_args
from dllm.harness.likelihood import masked_diffusion_loglikelihood
from dllm.harness.split import split_request
from dllm.prefilling.chunks import count_chunks

MODEL_NAME = "prefilling-dllm"
DEFAULT_GEN_LENGTH = 256  # the harness's own default max_gen_toks
_HANDLED_GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature")
log = logging.getLogger(__name__)


@dataclass
class _Job:
    """One generate_until request, ready to decode."""

    index: int
    key: tuple  # requests of one key decode in one batch
    inputs: object  # PromptParts (prefilling) or a [L] prompt tensor
    until: list
    gen_length: int
    temperature: float
    prefilling: object  # the request's PrefillingConfig (K fitted to its chunks) or None


@register_model(MODEL_NAME)
class PrefillingDLLM(LM):
    """A Dream / LLaDA checkpoint decoded by :func:`dllm.generate` for lm-evaluation-harness.

    Args:
        **model_args: the ``--model_args`` keys of :data:`dllm.harness.args.MODEL_ARGS` (``pretrained``,
            ``method``, ``chunk_size``, ``top_k``, ``gen_length``, ``steps``, ``mc_samples``, ...), plus
            the ``batch_size`` / ``max_batch_size`` / ``device`` the harness adds.

    Raises:
        ModelArgsError: a bad key or value (one line, before the weights load: :func:`parse_model_args`), or
            a checkpoint without a tokenizer.
        dllm.ConfigError, dllm.WeightError: as :func:`dllm.load_model`.
    """

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """lm-eval's constructor from ``--model_args`` text; refuses a value in another script's digits first
        (lm-eval's parser reads ``chunk_size=٣`` as 3: :func:`dllm.harness.args.check_model_args_text`).

        Raises:
            ModelArgsError: naming the key and value; else what ``__init__`` raises.
        """
        check_model_args_text(arg_string or "")
        return super().create_from_arg_string(arg_string, additional_config)

    def __init__(self, **model_args):
        super().__init__()
        import dllm
        from dllm.model.loader import default_model_dir

        self.settings = s = parse_model_args(model_args)  # every value, against config.json too: no weights yet
        model_dir = s.pretrained or default_model_dir()
        self.model = dllm.load_model(
            model_dir, device=s.device, dtype=s.dtype, tokenizer_path=s.tokenizer, rope_theta=s.rope_theta
        )
        if self.model.tokenizer is None:
            raise ModelArgsError(f"model_args pretrained={model_dir}: the checkpoint has no tokenizer")
        self._device = self.model.device
        self._chat = False  # set once the harness renders prompts with the chat template
        self._warned = set()

    # ---------------------------------------------------------------- chat templates

    @property
    def tokenizer_name(self) -> str:
        """The checkpoint's path with '/' as '__' (fingerprints the harness's request cache)."""
        return str(self.model.model_dir).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokenizer's chat template string (None when it has none)."""
        return getattr(self.model.tokenizer, "chat_template", None) if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render the harness's messages with the tokenizer's chat template (no BOS added afterwards).

        Raises:
            ValueError: the tokenizer has no chat template.
        """
        tok = self.model.tokenizer
        if not getattr(tok, "chat_template", None):
            raise ValueError(
                f"the tokenizer of {self.model.model_dir} has no chat template: drop --apply_chat_template"
            )
        self._chat = True
        return tok.apply_chat_template(chat_history, tokenize=False, add_generation_prompt=add_generation_prompt)

    @property
    def _add_bos(self) -> bool:
        return self.settings.add_bos and not self._chat

    # ---------------------------------------------------------------- generate_until

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Answer ``generate_until`` requests (``args = (prompt, gen_kwargs)``); see the module docstring.

        Returns:
            One string per request, in request order.

        Raises:
            ValueError: a prompt that cannot be split for prefilling, an explicit ``top_k`` above a
                context's chunk count, a gen length that ``block_length`` does not divide; all checked
                before the first request decodes.
        """
        import dllm

        jobs = [self._job(i, req) for i, req in enumerate(requests)]
        groups = defaultdict(list)
        for job in jobs:
            groups[job.key].append(job)
        out = [None] * len(jobs)
        size = self.settings.batch_size
        kw = self.settings.generate_kwargs()
        method = self.settings.method
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc=f"{MODEL_NAME} generate_until", disable=disable_tqdm)
        for members in groups.values():
            for at in range(0, len(members), size):
                batch = members[at : at + size]
                first = batch[0]
                if method == "prefilling":
                    inputs = {"prompt": [j.inputs for j in batch], "prefilling": first.prefilling}
                else:
                    inputs = {"input_ids": torch.stack([j.inputs for j in batch])}
                res = dllm.generate(
                    self.model,
                    **inputs,
                    method=method,
                    gen_length=first.gen_length,
                    temperature=first.temperature,
                    **kw,
                )
                for job, text in zip(batch, res.text):
                    out[job.index] = cut_at_stops(text, job.until)
                    self.cache_hook.add_partial("generate_until", requests[job.index].args, out[job.index])
                bar.update(len(batch))
        bar.close()
        return out

    def _job(self, index: int, req) -> _Job:
        s = self.settings
        text = req.args[0]
        gen_kwargs = dict(req.args[1]) if len(req.args) > 1 and req.args[1] else {}
        extra = sorted(set(gen_kwargs) - set(_HANDLED_GEN_KWARGS))
        if extra and tuple(extra) not in self._warned:
            self._warned.add(tuple(extra))
            log.warning("%s ignores the task's generation kwargs %s (set them as --model_args)", MODEL_NAME, extra)
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        gen_length = s.gen_length or int(gen_kwargs.get("max_gen_toks") or DEFAULT_GEN_LENGTH)
        if s.gen_length is None:  # the task's max_gen_toks: checked as a given gen_length is
            try:
                check_gen_length(s, gen_length, self.model.config.trained_positions)
            except ModelArgsError as exc:
                raise ValueError(f"{exc} (the task's max_gen_toks; set gen_length)") from None
        if s.temperature is not None:
            temperature = s.temperature
        else:
            temperature = float(gen_kwargs.get("temperature") or 0.0) if gen_kwargs.get("do_sample") else 0.0
        cfg = None
        if s.method == "prefilling":
            parts, _rule = split_request(
                self.model,
                text,
                req.doc,
                context_field=s.context_field,
                query_window=s.prefilling.query_window,
                add_bos=self._add_bos,
            )
            n_chunks = count_chunks(self.model, parts.context, s.prefilling)
            cfg = fit_top_k(s.prefilling, n_chunks, parts.context.numel(), explicit=s.explicit_top_k)
            key, inputs = (gen_length, temperature, cfg), parts
        else:
            from dllm.model.tokenization import encode_text

            inputs = encode_text(self.model, text, bos=self._add_bos)
            if inputs.numel() == 0:
                raise ValueError(f"request {index}: the prompt is empty")
            key = (gen_length, temperature, inputs.numel())
        return _Job(index, key, inputs, until, gen_length, temperature, cfg)

    # ---------------------------------------------------------------- loglikelihood

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Score ``loglikelihood`` requests (``args = (context, continuation)``) by the Monte Carlo ELBO.

        Returns:
            ``(log-likelihood in nats, is_greedy)`` per request, in request order.

        Raises:
            ValueError: an empty continuation.
        """
        from tqdm.auto import tqdm

        s = self.settings
        out = []
        for req in tqdm(requests, desc=f"{MODEL_NAME} loglikelihood", disable=disable_tqdm):
            context, continuation = req.args[0], req.args[1]
            ctx_ids, cont_ids = self._encode_pair(context, continuation)
            ll = masked_diffusion_loglikelihood(
                self.model,
                ctx_ids,
                cont_ids,
                samples=s.mc_samples,
                batch_size=self._mc_batch(ctx_ids.numel() + cont_ids.numel()),
                generator=self._request_generator(context, continuation),
            )
            greedy = self._is_greedy(ctx_ids, cont_ids) if s.greedy_check else False
            out.append((ll, greedy))
            self.cache_hook.add_partial("loglikelihood", req.args, out[-1])
        return out

    def _request_generator(self, context: str, continuation: str) -> torch.Generator | None:
        """The request's own generator (None without ``seed``): seeded by ``seed`` and a SHA-256 of the
        request's text, so a score never depends on which requests came before it."""
        if self.settings.seed is None:
            return None
        text = f"{self.settings.seed}\0{context}\0{continuation}".encode("utf-8", "surrogatepass")
        seed = int.from_bytes(hashlib.sha256(text).digest()[:8], "little")
        return torch.Generator(device=self.model.device).manual_seed(seed)

    def _mc_batch(self, tokens: int) -> int:
        """Masked copies per forward for a ``tokens``-long sequence: ``mc_batch_size``, fewer where the copies
        would pass ``mc_batch_tokens`` (1 at least); warns past the trained positions and notes the cost."""
        s = self.settings
        limit = getattr(self.model.config, "trained_positions", None)
        if limit and tokens > limit:
            warnings.warn(
                f"loglikelihood: context and continuation take {tokens} positions, past the model's {limit} "
                "trained positions: the score is computed out of distribution",
                PositionWindowWarning,
                stacklevel=3,
            )
        batch = max(1, min(s.mc_batch_size, s.mc_batch_tokens // tokens))
        if tokens > s.mc_batch_tokens and "mc_cost" not in self._warned:
            self._warned.add("mc_cost")
            log.warning(
                "%s: loglikelihood of a %d-token request costs mc_samples=%d dense forwards of the whole context "
                "(one copy per forward past mc_batch_tokens=%d); lower mc_samples for long contexts",
                MODEL_NAME,
                tokens,
                s.mc_samples,
                s.mc_batch_tokens,
            )
        return batch

    def _encode_pair(self, context: str, continuation: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``([P], [L])`` of a (context, continuation) pair, cut from the ids of context +
        continuation where the context's own ids end. When the tokenizer merged the boundary (a BPE
        tokenizer that writes a space with the word after it), the context's trailing spaces move to the
        continuation first, as the harness's own models do; if the boundary still does not fall on a token
        edge, the continuation is tokenized alone.

        Raises:
            ValueError: the continuation has no tokens.
        """
        from dllm.model.tokenization import encode_text

        def cut(ctx_text: str, cont_text: str):
            ctx = encode_text(self.model, ctx_text, bos=self._add_bos)
            whole = encode_text(self.model, ctx_text + cont_text, bos=self._add_bos)
            ok = whole.numel() > ctx.numel() and torch.equal(whole[: ctx.numel()], ctx)
            return ctx, (whole[ctx.numel() :] if ok else None)

        ctx, cont = cut(context, continuation)
        spaces = len(context) - len(context.rstrip())
        if cont is None and spaces:
            ctx, cont = cut(context[:-spaces], context[-spaces:] + continuation)
        if cont is None:
            cont = encode_text(self.model, continuation)
        if cont.numel() == 0:
            raise ValueError(f"loglikelihood: the continuation {continuation!r} has no tokens")
        return ctx, cont

    def _is_greedy(self, ctx_ids: torch.Tensor, cont_ids: torch.Tensor) -> bool:
        import dllm

        if ctx_ids.numel() == 0:
            if "greedy" not in self._warned:
                self._warned.add("greedy")
                log.warning("%s: is_greedy is False for requests with an empty context and add_bos=false", MODEL_NAME)
            return False
        n = cont_ids.numel()
        res = dllm.generate(self.model, ctx_ids[None], method="dense", gen_length=n, steps=n)
        return bool(torch.equal(res.tokens[0], cont_ids))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        """Not implemented: raises NotImplementedError (perplexity tasks need a chunked rolling ELBO)."""
        raise NotImplementedError(
            f"{MODEL_NAME} does not implement loglikelihood_rolling (perplexity tasks such as wikitext): a diffusion "
            "LM's likelihood is a Monte Carlo bound; use generate_until or multiple-choice (loglikelihood) tasks"
        )


def cut_at_stops(text: str, until: list) -> str:
    """``text`` up to the first occurrence of any stop string of ``until`` (empty strings ignored)."""
    cut = len(text)
    for stop in until:
        if stop:
            at = text.find(stop)
            if 0 <= at < cut:
                cut = at
    return text[:cut]


def fit_top_k(cfg, num_chunks: int, context_tokens: int, explicit: bool):
    """``cfg`` for a context of ``context_tokens`` cut into ``num_chunks`` chunks (snapped ones with
    ``boundary_snap``): the library's rule (:meth:`PrefillingConfig.for_chunks`, as ``dllm eval --top-k``);
    an explicit K above N is an error, a default K above it keeps every chunk (top_k None).

    Raises:
        ValueError: ``explicit`` and K above the chunk count.
    """
    from dllm.prefilling.config import TopKError, chunking

    try:
        return cfg.for_chunks(num_chunks, explicit=explicit)
    except TopKError:
        raise ValueError(
            f"model_args top_k={cfg.top_k} exceeds the {num_chunks} chunk(s) of a {context_tokens}-token context "
            f"at {chunking(cfg)}; lower top_k or chunk_size, or pass top_k=all"
        ) from None
