"""Every command and script path the documentation names exists in the tree.

The benchmarks moved into rooms (``bench/kernels``, ``bench/speed``, ``bench/fidelity``, ``bench/studies``,
``bench/tiny``); a ``python -m bench.demo`` left in a record or a README is a command a reader copies and
gets ``No module named``. The check reads the files git tracks, so it follows new records without a list.
"""

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULE = re.compile(r"python -m ((?:bench|dllm|triton_kernels)(?:\.[A-Za-z_0-9]+)*)(?!\.<)")
SCRIPT = re.compile(r"(?<![\w/.])((?:bench|dllm|triton_kernels|tests)/[A-Za-z_0-9/]+\.(?:py|sh))\b")


def _tracked_texts():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        names = out.split()
    except (OSError, subprocess.CalledProcessError):  # a source tarball without .git
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if ".venv" not in p.parts]
    for name in names:
        # the tests run what they name (and write made-up paths for the layout checks)
        if not name.endswith((".md", ".py", ".sh")) or name.startswith("tests/"):
            continue
        try:
            yield name, (ROOT / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def _module_exists(dotted):
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def test_module_rule_resolves_a_moved_script():
    # the checker itself: today's path resolves, the pre-rooms one does not
    assert _module_exists("bench.fidelity.demo")
    assert not _module_exists("bench.demo")
    assert MODULE.findall("run `python -m bench.speed.e2e_speed --record`.") == ["bench.speed.e2e_speed"]
    assert MODULE.findall("`python -m bench.<room>.<name>`") == []
    assert SCRIPT.findall("see bench/speed/flop_model.py and lm_eval/bench/x.py") == ["bench/speed/flop_model.py"]


@pytest.mark.parametrize("kind", ["module", "script"])
def test_every_named_command_exists(kind):
    missing = []
    for name, text in _tracked_texts():
        if kind == "module":
            missing += [f"{name}: python -m {m}" for m in MODULE.findall(text) if not _module_exists(m)]
        else:
            missing += [f"{name}: {p}" for p in SCRIPT.findall(text) if not (ROOT / p).is_file()]
    assert not missing, "commands or paths that no longer exist:\n" + "\n".join(sorted(set(missing)))
