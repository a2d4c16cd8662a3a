"""Passkey retrieval (InfiniteBench ``passkey``): a 5-digit key hidden in
repeated noise sentences.

Canonical wording (InfiniteBench): prefix "There is an important info hidden
inside a lot of irrelevant text. Find it and memorize it. I will quiz you about
the important information there.", needle "The pass key is 71432. Remember it.
71432 is the pass key.", query "What is the pass key? The pass key is ".
"""

from __future__ import annotations

from typing import Any

from .case import TaskCase
from .filler import DigitTaskSpec, make_digit_case

__all__ = ["PASSKEY", "make_passkey"]

PASSKEY = DigitTaskSpec(
    task="passkey",
    n_digits=5,
    needles=(
        "The pass key is {x}. Remember it. {x} is the pass key.",
        "The pass key is {x}.",
        "Remember this pass key: {x}.",
        "Important: the pass key is {x}. Keep it in mind.",
        "The secret pass key is {x}. Do not forget it.",
        "Note that the pass key is {x}. {x} is the pass key.",
    ),
    prefixes=(
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there.\n\n",
        "A pass key is hidden somewhere in the text below. Find it and remember it.\n\n",
        "Read the following text carefully. Somewhere in it there is a pass key that you will be asked about.\n\n",
        "Below is a long, mostly irrelevant text with one important piece of information in it.\n\n",
        "",
    ),
    queries=(
        "\n\nWhat is the pass key? The pass key is ",
        "\n\nWhat was the pass key hidden in the text? The pass key is ",
        "\n\nQuestion: What is the pass key?\nAnswer: The pass key is ",
        "\n\nRecall the pass key from the text above. The pass key is ",
        "\n\nWhat is the pass key? Answer: ",
        "\n\nThe pass key mentioned above is ",
    ),
)


def make_passkey(
    length: int,
    depth: float,
    seed: int,
    *,
    tokenizer: Any = None,
    phrasing: str = "canonical",
    split: str = "eval",
) -> TaskCase:
    """Generate a passkey case: a 5-digit key (10000-99999) in noise filler.

    Args:
        length: context length in tokens (characters when tokenizer is None).
        depth: needle depth in [0, 1] (fraction of filler tokens before the needle).
        seed: integer seed (same arguments -> identical case).
        tokenizer: None (character level) or a Hugging Face tokenizer.
        phrasing: "canonical" (InfiniteBench wording) or "random" (paraphrases,
            varied filler).
        split: "eval" or "train" (validated; no effect on this task).

    Returns:
        A :class:`~dllm.tasks.case.TaskCase` whose answer is the 5-digit key.

    Raises:
        ValueError: depth outside [0, 1], bad length/phrasing/split, or a length
            too short for the needle (the message gives the minimum).

    Source: InfiniteBench ``passkey`` (Zhang et al., 2024).
    """
    return make_digit_case(PASSKEY, length, depth, seed, tokenizer=tokenizer, phrasing=phrasing, split=split)
