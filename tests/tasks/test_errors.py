"""Clear ValueErrors for bad arguments."""

from __future__ import annotations

import pytest

from dllm.eval.tasks import TASKS, make_case, make_cases
from dllm.eval.tasks.essays import essay_dir

try:
    essay_dir()
    TASK_NAMES = list(TASKS)
except FileNotFoundError:
    TASK_NAMES = [t for t in TASKS if t != "needle"]


@pytest.mark.parametrize("task", TASK_NAMES)
def test_too_short(task):
    with pytest.raises(ValueError, match=r"too short.*at least (\d+) tokens"):
        make_case(task, 20, 0.5, 0)


@pytest.mark.parametrize("task", ["passkey", "kv_retrieval"])
def test_minimum_in_message_is_right(task):
    with pytest.raises(ValueError) as info:
        make_case(task, 10, 0.5, 0)
    minimum = int(info.value.args[0].split("at least ")[1].split()[0])
    make_case(task, minimum, 0.5, 0)  # the stated minimum works
    with pytest.raises(ValueError):
        make_case(task, minimum - 1, 0.5, 0)


@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("depth", [-0.1, 1.5, float("nan")])
def test_bad_depth(task, depth):
    with pytest.raises(ValueError, match="depth"):
        make_case(task, 1000, depth, 0)


def test_unknown_task_phrasing_split_and_n():
    with pytest.raises(ValueError, match="unknown task 'passkeys'"):
        make_case("passkeys", 1000, 0.5, 0)
    with pytest.raises(ValueError, match="unknown phrasing"):
        make_case("passkey", 1000, 0.5, 0, phrasing="fancy")
    with pytest.raises(ValueError, match="unknown split"):
        make_case("passkey", 1000, 0.5, 0, split="test")
    with pytest.raises(ValueError, match="n must be"):
        make_cases("passkey", [1000], [0.5], 0)
    with pytest.raises(ValueError, match="length"):
        make_case("passkey", 0, 0.5, 0)
    with pytest.raises(ValueError, match="length"):
        make_case("passkey", 1000.5, 0.5, 0)
