"""Every Triton kernel the interpreter runs, compiled for a real GPU as well (sm_90, the H100 / H200), on any
machine: Triton's compiler needs no GPU to go from a kernel to a cubin.

The interpreter executes a kernel's Python with numpy: it does not type-check branches a constexpr switches off,
and the PDL specialisations never run on CPU tensors. So a kernel edited under the interpreter could still fail to
compile on the device (the 2026-12-05 expert-kernel refactor did: "Inconsistent return types" across constexpr
branches). With KESTREL_SM90_COMPILE=1 and TRITON_INTERPRET=1, tests/gpu/conftest.py hooks the interpreter's launch
so that each new specialisation it sees (argument dtypes and alignments, constexprs, options) is first compiled by
the real compiler, and again with PDL on for kernels that take a PDL constexpr; a compile error fails the test that
launched the kernel.
"""

import contextlib
import os
import re
import shutil
import subprocess
import sys

import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile, make_backend
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction, create_function_from_signature

TARGET = GPUTarget("cuda", 90, 32)
_backend = make_backend(TARGET)
_real: dict = {}  # the Python function -> its JITFunction
# the Python function -> its argument binder for the sm_90 backend (not keyed by the JITFunction: its hash walks its
# globals, which outside a compile are InterpretedFunctions it cannot take)
_binders: dict = {}
seen: dict = {}  # specialisation key -> the kernel's name (what was compiled, for the report)
# KESTREL_SM90_REGS=1: each compiled specialisation's registers and spills a thread, from `ptxas -v` on its PTX
# (ptxas ships with the CUDA toolkit, which these CPU machines have): a kernel's register count sets how many of
# its programs an SM holds, so whether a launch's grid streams in one wave (docs/kernels.md, 2026-12-06 20:22)
REGS = os.environ.get("KESTREL_SM90_REGS") == "1"
regs: dict = {}  # specialisation key -> (kernel, PDL, warps, registers, spill store bytes, spill load bytes)
# a list: each compiled specialisation's CompiledKernel is appended to it (benchmarks/sm90_layouts.py, the settle's
# layout test in tests/ops/test_sm90_compile.py); None: none kept
kept: list | None = None
# what the interpreter patches (and, for a helper called from an interpreted kernel, leaves patched): their
# attributes as imported, taken by install() before any kernel is interpreted
_LANG = (tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base)
_pristine: list = []
_MISSING = object()


def _as_jit(f: InterpretedFunction) -> JITFunction:
    jf = _real.get(f.fn)
    if jf is None:
        keep = ("version", "do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline", "repr",
                "launch_metadata")
        jf = _real[f.fn] = JITFunction(f.fn, **{k: v for k, v in f.kwargs.items() if k in keep})
    return jf


@contextlib.contextmanager
def _real_functions(own_module: str):
    """While a kernel compiles: triton.language as imported (not as the interpreter patched it), and the @triton.jit
    helpers of kestrel's modules, of the kernel's own module and of triton.language (tl.sigmoid, the reductions'
    combine functions, ...) as JITFunctions: under the interpreter every @triton.jit is an InterpretedFunction,
    which the compiler cannot call."""
    swapped = []
    for obj, clean in zip(_LANG, _pristine):
        now = dict(vars(obj))
        for k in set(now) | set(clean):
            if now.get(k, _MISSING) is not clean.get(k, _MISSING):
                swapped.append((obj, k, now.get(k, _MISSING)))
                if k in clean:
                    setattr(obj, k, clean[k])
                else:
                    delattr(obj, k)
    for name, mod in list(sys.modules.items()):
        if (name.startswith(("kestrel.", "triton.language")) or name == own_module) and mod is not None:
            d = vars(mod)
            for k, v in list(d.items()):
                if isinstance(v, InterpretedFunction):
                    swapped.append((mod, k, v))
                    setattr(mod, k, _as_jit(v))
    try:
        yield
    finally:
        for obj, k, v in reversed(swapped):
            if v is _MISSING:
                delattr(obj, k)
            else:
                setattr(obj, k, v)


def compile_launch(f: InterpretedFunction, args, kwargs) -> None:
    """Compile the specialisation of f that this launch (args, kwargs) asks for, and its PDL twin, for sm_90."""
    jf = _as_jit(f)
    binder = _binders.get(f.fn)
    if binder is None:
        binder = _binders[f.fn] = create_function_from_signature(jf.signature, jf.params, _backend)
    variants = [dict(kwargs)]
    if kwargs.get("PDL") is False:
        variants.append({**kwargs, "PDL": True, "launch_pdl": True})
    for kw in variants:
        bound, spec, opts = binder(*args, **kw)
        options, signature, constexprs, attrs = jf._pack_args(_backend, kw, bound, spec, opts)
        key = (f.fn, repr(signature), repr(constexprs), repr(attrs), repr(sorted(options.__dict__.items())))
        if key in seen:
            continue
        with _real_functions(f.fn.__module__):
            kernel = compile(ASTSource(jf, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
        seen[key] = f.fn.__name__
        if kept is not None:
            kept.append(kernel)
        if REGS:
            regs[key] = (f.fn.__name__, bool(kw.get("PDL")), options.num_warps, *ptxas_usage(kernel.asm["ptx"]))


def layout_counts(kernel) -> tuple[int, int, int | None]:
    """(layout conversions in its TTGIR, barriers in its PTX, barriers after its PDL wait or None without one) of a
    compiled kernel: each conversion is a round trip through shared memory."""
    ptx = kernel.asm["ptx"]
    wait = ptx.find("griddepcontrol.wait")
    return (kernel.asm["ttgir"].count("convert_layout"), ptx.count("bar.sync"),
            ptx[wait:].count("bar.sync") if wait >= 0 else None)


def ptxas_usage(ptx: str) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) a thread of a compiled kernel, from `ptxas -v`."""
    import triton.backends.nvidia as nv

    bundled = os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")  # Triton's wheel ships one
    exe = shutil.which("ptxas") or (bundled if os.path.exists(bundled) else None)
    if exe is None:
        raise RuntimeError("KESTREL_SM90_REGS=1 needs ptxas (the CUDA toolkit, or Triton's wheel)")
    arch = re.search(r"^\.target\s+(\w+)", ptx, re.M).group(1)
    out = subprocess.run([exe, "-v", f"-arch={arch}", "-", "-o", os.devnull], input=ptx, capture_output=True,
                         text=True, check=True).stderr
    used = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return used, int(spills.group(1)) if spills else 0, int(spills.group(2)) if spills else 0


def install() -> None:
    """Hook the interpreter's launch (idempotent)."""
    if getattr(InterpretedFunction.run, "_sm90", False):
        return
    _pristine[:] = [dict(vars(obj)) for obj in _LANG]
    run = InterpretedFunction.run

    def checked(self, *args, grid, warmup, **kwargs):
        if not warmup:
            compile_launch(self, args, kwargs)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    checked._sm90 = True
    InterpretedFunction.run = checked
