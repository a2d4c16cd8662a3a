"""Triton's real CUDA launcher on a CPU, against a recording stand-in for libcuda.

The direct launch path of :mod:`triton_kernels._launch` calls ``CompiledKernel.run`` itself; only the CUDA
driver sees what it finally launches. :func:`fake_cuda_driver` builds ``fake_libcuda/fake_libcuda.c`` with gcc
as ``libcuda.so.1`` and points Triton's nvidia backend at it: Triton compiles its own launcher
(``backends/nvidia/driver.c``) against the stand-in as it would against the driver, kernels compile to sm_90
cubins with the ptxas of the Triton wheel, and every ``cuLaunchKernelEx`` the unmodified launcher makes is
recorded (:class:`Record`: grid, block, shared memory, stream, function, launch attributes and the bytes of
each kernel parameter) instead of run. Tensors are CPU tensors: the stand-in hands back host addresses as
device pointers.

Inside the context the package's kernels are fresh ``JITFunction``s, Triton's nvidia ``CudaDriver`` is the
active driver on a fake device 0 and stream :data:`FAKE_STREAM`, the direct path is on, and the ops' device
checks let CPU tensors through. Everything is put back on exit; the Triton cache is a temporary directory.
It needs kernels compiled, not interpreted: the test suite runs the interpreter, so a test module using it
runs itself in a clean process through :func:`run_clean` (whose docstring says why a process of its own).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import triton

SOURCE = Path(__file__).resolve().parent / "fake_libcuda" / "fake_libcuda.c"
FAKE_STREAM = 0x5EED5000  # what get_current_stream answers inside the context
WORKER = "PREFILLING_DLLM_FAKE_CUDA_WORKER"  # set in the process run_clean starts

# Bytes each launcher argument takes in ``params[]``, by the extractor index of the launcher's signature
# (``CudaLauncher.kernel_signature``; ``extraction_map`` in Triton 3.9's backends/nvidia/driver.c):
# pointer, i8, i16, i32, i64, u8, u16, u32, u64, fp16, bf16, fp32, fp64, nvTmaDesc (a 128-byte CUtensorMap).
PARAM_BYTES = {1: 8, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 2, 12: 4, 13: 8, 14: 128}
SCRATCH_POINTERS = 2  # the launcher appends the global and the profile scratch pointers to every launch


class _Launch(ctypes.Structure):
    """``FakeLaunch`` of fake_libcuda.c."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("num_attrs", ctypes.c_uint),
        ("stream", ctypes.c_ulonglong),
        ("function", ctypes.c_ulonglong),
        ("extra", ctypes.c_ulonglong),
        ("attr_ids", ctypes.c_uint * 8),
        ("attr_values", (ctypes.c_ubyte * 64) * 8),
        ("name", ctypes.c_char * 128),
        ("num_params", ctypes.c_int),
        ("param_bytes", ctypes.c_uint),
        ("params", ctypes.c_ubyte * 2048),
    ]


@dataclass(frozen=True)
class Record:
    """One ``cuLaunchKernelEx`` as the driver received it. ``params``: the bytes of each kernel parameter,
    None when the function's parameter sizes were not registered (:meth:`FakeCuda.register`)."""

    name: str
    grid: tuple
    block: tuple
    shared_mem: int
    stream: int
    function: int
    extra: int
    attrs: tuple  # ((id, 64 value bytes), ...)
    params: tuple | None

    def differences(self, other: Record) -> list[str]:
        """The fields in which ``other`` differs (``params[i]`` per parameter), empty when identical."""
        out = []
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "params" and a is not None and b is not None and len(a) == len(b):
                out += [f"params[{i}]" for i, (x, y) in enumerate(zip(a, b)) if x != y]
            elif a != b:
                out.append(f.name)
        return out


class FakeCuda:
    """The loaded stand-in library: its records, and the package's kernels as fresh ``JITFunction``s."""

    def __init__(self, lib: ctypes.CDLL, driver, kernels: dict):
        self.lib = lib
        self.driver = driver
        self.kernels = kernels  # kernel name -> the JITFunction the ops launch inside the context
        self.stream = FAKE_STREAM
        self.sizes: dict = {}  # function handle -> the byte size of each of its launch parameters

    def reset(self) -> None:
        """Forget the records so far."""
        self.lib.fake_reset()

    def records(self) -> list[Record]:
        """Every launch since the last :meth:`reset`, in order."""
        out = []
        raw = _Launch()
        for i in range(self.lib.fake_launch_count()):
            assert self.lib.fake_get_launch(i, ctypes.byref(raw)) == 0
            params = None
            if raw.num_params >= 0:
                sizes = self.sizes[raw.function]
                data, off, params = bytes(raw.params[: raw.param_bytes]), 0, []
                for size in sizes:
                    params.append(data[off : off + size])
                    off += size
                params = tuple(params)
            scalars = {f: getattr(raw, f) for f in ("shared_mem", "stream", "function", "extra")}
            attrs = tuple((raw.attr_ids[j], bytes(raw.attr_values[j])) for j in range(min(raw.num_attrs, 8)))
            grid, block = tuple(raw.grid), tuple(raw.block)
            out.append(Record(raw.name.decode(), grid, block, **scalars, attrs=attrs, params=params))
        return out

    def register(self, compiled) -> tuple:
        """Tell the stand-in the byte size of each launch parameter of ``compiled`` (a CompiledKernel that
        has been launched once), read from its launcher's signature; returns the sizes."""
        launcher = compiled.run
        signature = getattr(launcher, "kernel_signature", None)
        if signature is None or getattr(launcher, "gsan_enabled", False):
            pytest.skip(f"the launcher of Triton {triton.__version__} is not the one these records were written for")
        kept = [t for t in compiled.src.signature.values() if t != "constexpr"]  # scalars and tensors, flat
        assert len(signature) == len(kept), (compiled.name, list(signature), kept)
        sizes = tuple(PARAM_BYTES[i] for i in signature) + (8,) * SCRATCH_POINTERS
        arr = (ctypes.c_uint * len(sizes))(*sizes)
        assert self.lib.fake_set_param_sizes(ctypes.c_ulonglong(compiled.function), len(sizes), arr) == 0
        self.sizes[compiled.function] = sizes
        return sizes


def missing_toolchain() -> str | None:
    """Why the stand-in cannot be built here (no C compiler, no Python headers), or None."""
    if not (os.environ.get("CC") or shutil.which("gcc")):
        return "no C compiler: gcc builds the stand-in libcuda and Triton's launcher"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python.h: Triton's launcher is a C extension module"
    return None


_LIB: list = []  # the library, built and loaded once per process (see _load_library)


def _load_library() -> tuple[ctypes.CDLL, str]:
    """Build fake_libcuda.c as ``libcuda.so.1`` (+ ``libcuda.so``) in a temporary directory and load it.

    Once per process: the launcher and its ``dlopen("libcuda.so.1")`` find the first library loaded under that
    soname, so a second build could never receive the launches."""
    if not _LIB:
        from triton.backends.nvidia import driver as nv

        where = tempfile.mkdtemp(prefix="fake_libcuda_")
        atexit.register(shutil.rmtree, where, True)
        so = os.path.join(where, "libcuda.so.1")
        cc = os.environ.get("CC") or shutil.which("gcc")
        cmd = [cc, "-shared", "-fPIC", "-O1", f"-I{nv.include_dirs[0]}", "-Wl,-soname,libcuda.so.1", str(SOURCE)]
        built = subprocess.run([*cmd, "-o", so], capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"building {SOURCE.name} failed:\n{built.stderr}")
        os.symlink("libcuda.so.1", os.path.join(where, "libcuda.so"))
        lib = ctypes.CDLL(so, mode=ctypes.RTLD_GLOBAL)
        lib.fake_launch_count.restype = ctypes.c_uint
        lib.fake_get_launch.argtypes = [ctypes.c_uint, ctypes.POINTER(_Launch)]
        lib.fake_set_param_sizes.argtypes = [ctypes.c_ulonglong, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint)]
        _LIB[:] = [lib, where]
    return _LIB[0], _LIB[1]


# JITFunction's options that it keeps under their own names (repr, the one other, as _repr)
_JIT_OPTIONS = "version do_not_specialize do_not_specialize_on_alignment debug noinline launch_metadata".split()


def _rejit(obj):
    """A fresh JITFunction of the same Python function and options as the JITFunction ``obj``."""
    from triton.runtime.jit import JITFunction

    return JITFunction(obj.fn, repr=obj._repr, **{name: getattr(obj, name) for name in _JIT_OPTIONS})


def run_clean(test_file: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the pytest module ``test_file`` in a new process with the interpreter off (``TRITON_INTERPRET=0``)
    and :data:`WORKER` set, from the repository root; returns the finished process (stdout and stderr merged).

    Why a process of its own: a process that ran interpreted kernels cannot compile them any more. Triton's
    interpreter patches ``triton.language`` while a kernel runs, and an interpreted ``@triton.jit`` helper
    called from a kernel (``InterpretedFunction.__call__``) patches it again without restoring it: after, say,
    split-S under the interpreter, ``triton.language.core.cast`` is still the interpreter's, and compiling a
    kernel fails. The rest of the suite runs the interpreter, in any order."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="0", **{WORKER: "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)]
    return subprocess.run(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )


@contextlib.contextmanager
def fake_cuda_driver(cache_dir: Path):
    """Inside: Triton launches through its real CUDA launcher into the stand-in (see the module docstring).
    Yields a :class:`FakeCuda`. ``cache_dir``: the Triton cache (compiled kernels and launcher).

    Needs a process whose kernels were built by ``triton.jit`` without the interpreter (see :func:`run_clean`)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import driver as nv
    from triton.runtime import jit as jit_mod
    from triton.runtime.jit import JITFunction

    import triton_kernels
    from triton_kernels import _launch, _validate

    for info in pkgutil.iter_modules(triton_kernels.__path__):  # every module that may hold a kernel
        importlib.import_module(f"triton_kernels.{info.name}")
    ours = {n: m for n, m in sys.modules.items() if n.startswith("triton_kernels.") and m is not None}
    found = {(n, a): v for n, m in ours.items() for a, v in vars(m).items() if a.endswith("_kernel")}
    interpreted = sorted(a for (n, a), v in found.items() if type(v).__name__ == "InterpretedFunction")
    if interpreted:
        raise RuntimeError(
            f"{', '.join(interpreted)} were built by the Triton interpreter (TRITON_INTERPRET=1 at import): "
            "run the module through run_clean()"
        )
    lib, lib_dir = _load_library()
    mp = pytest.MonkeyPatch()
    registry = dict(jit_mod._triton_jit_function_registry)
    try:
        with knobs.cache.scope(), knobs.nvidia.scope(), knobs.runtime.scope():
            mp.delenv("TRITON_INTERPRET", raising=False)
            mp.delenv(getattr(_launch, "DIRECT_LAUNCH_ENV", "PREFILLING_DLLM_DIRECT_LAUNCH"), raising=False)  # path on
            mp.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated (it warns otherwise)
            knobs.runtime.interpret = False
            knobs.cache.dir = str(cache_dir)
            knobs.nvidia.libcuda_path = lib_dir
            nv.libcuda_dirs.cache_clear()
            nv.library_dirs.cache_clear()
            # what building the driver sets: the singleton launcher module and its types
            mp.delattr(nv.CudaUtils, "instance", raising=False)
            for name in ("PyCUtensorMap", "PyKernelArg", "ARG_CONSTEXPR", "ARG_KERNEL", "ARG_TUPLE"):
                mp.setattr(nv, name, getattr(nv, name))
            driver = nv.CudaDriver()  # compiles driver.c against the stand-in
            driver.get_current_device = lambda: 0  # GPUDriver binds these to torch.cuda
            driver.set_current_device = lambda device: None
            driver.get_current_stream = lambda device: FAKE_STREAM
            driver.get_device_capability = lambda device: (9, 0)
            driver.get_current_target = lambda: GPUTarget("cuda", 90, 32)
            config = triton.runtime.driver
            mp.setattr(config, "_active", config._active)  # restored as it was: reset_active() would build
            config.set_active(driver)  # the default driver, which raises without a GPU

            # the package's kernels as fresh JITFunctions: what they compile here stays out of their own caches
            kernels = {}
            for (modname, attr), obj in found.items():
                if type(obj) is JITFunction:
                    kernels.setdefault(attr, _rejit(obj))
                    mp.setattr(ours[modname], attr, kernels[attr])
            for mod in ours.values():
                if hasattr(mod, "require_runnable"):  # CPU tensors stand for device memory here
                    mp.setattr(mod, "require_runnable", lambda *a, **k: None)

            mp.setattr(_launch, "_DIRECT", True)
            mp.setattr(_launch, "_CURRENT", [])  # bound afresh to this driver on the first direct launch
            mp.setattr(_validate, "_PASSED", {})  # the ops' prepared calls made here hold these kernels
            _launch.clear_launch_cache()
            lib.fake_reset()
            fake = FakeCuda(lib, driver, kernels)
            try:
                yield fake
            finally:
                _launch.clear_launch_cache()
                # forget the module handles: the stand-in holds nothing to free, and CompiledKernel.__del__
                # would unload them through whichever driver is active by then
                for fn in kernels.values():
                    for cache in fn.device_caches.values():
                        for compiled in cache[0].values():
                            compiled.module = None
                        cache[0].clear()
                gc.collect()
    finally:
        mp.undo()
        nv.libcuda_dirs.cache_clear()
        nv.library_dirs.cache_clear()
        jit_mod._triton_jit_function_registry.clear()
        jit_mod._triton_jit_function_registry.update(registry)
        lib.fake_reset()
