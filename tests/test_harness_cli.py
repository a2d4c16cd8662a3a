"""``python -m dllm.harness`` without lm-eval: a package a task imports and lm-eval does not install is one
``error:`` line naming the install command, found before the weights load when the task
says so by its name. lm-eval is replaced by a stand-in whose run raises as LongBench's metrics module does.

(The same with lm-eval itself: tests/test_harness_lm_eval.py, ``make test-harness``.)
"""

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

from dllm.harness import cli

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"


def _raise_like_longbench_metrics(missing: str):
    """What lm-eval's longbench/metrics.py does when a package is missing: a bare ImportError of its own,
    raised while handling the ModuleNotFoundError."""
    try:
        raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)
    except ImportError:
        raise ImportError("Please install the required dependencies for this task with `pip install ...`") from None


@pytest.fixture()
def fake_lm_eval(monkeypatch):
    """lm-eval's CLI replaced: each run calls ``runs[-1]`` (a function of the harness argv)."""
    runs = []

    class HarnessCLI:
        def parse_args(self):
            return list(sys.argv[1:])

        def execute(self, argv):
            runs[-1](argv)

    module = types.ModuleType("lm_eval._cli")
    module.HarnessCLI = HarnessCLI
    monkeypatch.setitem(sys.modules, "lm_eval", types.ModuleType("lm_eval"))
    monkeypatch.setitem(sys.modules, "lm_eval._cli", module)
    monkeypatch.setitem(sys.modules, "dllm.harness.model", types.ModuleType("dllm.harness.model"))
    return runs


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_a_task_package_lm_eval_does_not_install_is_one_line_with_the_install_command(fake_lm_eval, capsys):
    def run(argv):
        assert argv[0] == "run"
        _raise_like_longbench_metrics("fuzzywuzzy")

    fake_lm_eval.append(run)
    assert cli.main(["--tasks", "my_group", "--limit", "1"]) == 2
    assert _one_error_line(capsys) == (
        "error: the task needs the 'fuzzywuzzy' package (longbench: jieba, fuzzywuzzy, rouge), which lm-eval does "
        "not install: pip install -e '.[longbench]'"
    )
    # a package we know nothing of: named, with lm-eval's own message
    fake_lm_eval.append(lambda argv: _raise_like_longbench_metrics("sacrebleu"))
    assert cli.main(["--tasks", "other"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: the task needs the 'sacrebleu' package, which is not installed") and "Please" in line
    with pytest.raises(ImportError):  # --debug: the traceback
        cli.main(["--tasks", "other", "--debug"])


def test_a_longbench_task_without_its_packages_fails_before_the_model_loads(fake_lm_eval, capsys, monkeypatch):
    found = {"jieba", "fuzzywuzzy"}  # installed, as far as the check can tell; rouge is not
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in found else None)
    fake_lm_eval.append(lambda argv: pytest.fail("the harness ran (it loads the weights before the tasks)"))
    for tasks in (["--tasks", "longbench_qasper"], ["-t", "hellaswag", "LongBench_e"], ["--tasks=x,longbench"]):
        assert cli.main([*tasks, "--limit", "1"]) == 2
        assert _one_error_line(capsys).endswith("'rouge' package (longbench: jieba, fuzzywuzzy, rouge), which "
                                                "lm-eval does not install: pip install -e '.[longbench]'")  # fmt: skip
    ran = []
    fake_lm_eval.append(ran.append)
    assert cli.main(["--tasks", "hellaswag", "--limit", "1"]) == 0 and len(ran) == 1  # other tasks: no check


def test_requested_tasks():
    assert cli.requested_tasks(["run", "--tasks", "a,b", "c", "--limit", "2", "-t=D"]) == ["a", "b", "c", "d"]
    assert cli.requested_tasks(["--limit", "3", "-t", "x"]) == ["x"] and cli.requested_tasks(["x"]) == []


def test_the_extras_the_errors_name_are_declared():
    """Every extra an error line names is in setup.py's extras_require, as lm-eval's extra of that name."""
    text = SETUP_PY.read_text()
    for extra in set(cli.TASK_EXTRAS.values()):
        assert re.search(rf'"{extra}": \[f"lm-eval\[{extra}\]==\{{LM_EVAL\}}"\]', text), extra
