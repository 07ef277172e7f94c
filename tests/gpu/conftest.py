import pytest


def pytest_addoption(parser):
    parser.addoption("--disable-pdl", action="store_true",
                     help="run the GPU kernel and model tests without programmatic dependent launch (kestrel.ops.PDL; "
                          "engines built by a test follow their own --disable-pdl, on by default)")


@pytest.fixture(autouse=True)
def _pdl(request, monkeypatch):
    """Every GPU test starts from the same launch mode (the engine default, PDL on, unless --disable-pdl) and leaves
    the process-wide flag as it found it."""
    import kestrel.ops

    monkeypatch.setattr(kestrel.ops, "PDL", not request.config.getoption("--disable-pdl"))


def pytest_configure(config):
    import os

    if os.environ.get("KESTREL_SM90_COMPILE") == "1" and os.environ.get("TRITON_INTERPRET") == "1":
        from tests.gpu import sm90

        sm90.install()


def pytest_terminal_summary(terminalreporter):
    import sys

    sm90 = sys.modules.get("tests.gpu.sm90")
    if sm90 is not None and sm90.seen:
        terminalreporter.write_line(f"sm_90 compiles: {len(sm90.seen)} specialisations of "
                                    f"{len(set(sm90.seen.values()))} kernels")
    if sm90 is not None and sm90.regs:  # KESTREL_SM90_REGS=1 (one process: without -n)
        terminalreporter.write_line("registers a thread (kernel, PDL, warps: registers, spill bytes stored / "
                                    "loaded), the most first:")
        for name, pdl, warps, used, st, ld in sorted(set(sm90.regs.values()), key=lambda r: -r[3])[:40]:
            terminalreporter.write_line(f"  {name:<32} PDL {pdl!s:<5} warps {warps:2d}: {used:3d}  {st} / {ld}")
