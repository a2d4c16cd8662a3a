"""Number-string retrieval (InfiniteBench ``number_string``): a 10-digit number
hidden in the same repeated noise sentences as the passkey task.

Canonical needle: "The sequence of digits is 3918402756. Remember it.
3918402756 is the sequence of digits."; query "What is the sequence of digits?
The sequence of digits is ". The first digit is never 0.
"""

from __future__ import annotations

from typing import Any

from .case import TaskCase
from .filler import DigitTaskSpec, make_digit_case

__all__ = ["NUMBER_STRING", "make_number_string"]

NUMBER_STRING = DigitTaskSpec(
    task="number_string",
    n_digits=10,
    needles=(
        "The sequence of digits is {x}. Remember it. {x} is the sequence of digits.",
        "The sequence of digits is {x}.",
        "Remember this sequence of digits: {x}.",
        "Important: the sequence of digits is {x}. Keep it in mind.",
        "The secret number is {x}. Do not forget it.",
        "Note that the sequence of digits is {x}. {x} is the sequence of digits.",
    ),
    prefixes=(
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there.\n\n",
        "A long number is hidden somewhere in the text below. Find it and remember it.\n\n",
        "Read the following text carefully. Somewhere in it there is a sequence of digits that you "
        "will be asked about.\n\n",
        "Below is a long, mostly irrelevant text with one important piece of information in it.\n\n",
        "",
    ),
    queries=(
        "\n\nWhat is the sequence of digits? The sequence of digits is ",
        "\n\nWhat was the number hidden in the text? The number is ",
        "\n\nQuestion: What is the sequence of digits?\nAnswer: The sequence of digits is ",
        "\n\nRecall the sequence of digits from the text above. The sequence of digits is ",
        "\n\nWhat is the hidden number? Answer: ",
        "\n\nThe sequence of digits mentioned above is ",
    ),
)


def make_number_string(
    length: int,
    depth: float,
    seed: int,
    *,
    tokenizer: Any = None,
    phrasing: str = "canonical",
    split: str = "eval",
) -> TaskCase:
    """Generate a number_string case: a 10-digit number (first digit 1-9) in noise filler.

    Args:
        length: context length in tokens (characters when tokenizer is None).
        depth: needle depth in [0, 1] (fraction of filler tokens before the needle).
        seed: integer seed (same arguments -> identical case).
        tokenizer: None (character level) or a Hugging Face tokenizer.
        phrasing: "canonical" (InfiniteBench-style wording) or "random".
        split: "eval" or "train" (validated; no effect on this task).

    Returns:
        A :class:`~dllm.tasks.case.TaskCase` whose answer is the 10-digit string.

    Raises:
        ValueError: depth outside [0, 1], bad length/phrasing/split, or a length
            too short for the needle (the message gives the minimum).

    Source: InfiniteBench ``number_string`` (Zhang et al., 2024).
    """
    return make_digit_case(NUMBER_STRING, length, depth, seed, tokenizer=tokenizer, phrasing=phrasing, split=split)
