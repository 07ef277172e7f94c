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
