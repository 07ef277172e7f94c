import pytest


def pytest_addoption(parser):
    parser.addoption("--enable-pdl", action="store_true",
                     help="run the GPU tests with programmatic dependent launch on (kestrel.ops.PDL)")


@pytest.fixture(autouse=True)
def _pdl(request, monkeypatch):
    if request.config.getoption("--enable-pdl"):
        import kestrel.ops

        monkeypatch.setattr(kestrel.ops, "PDL", True)
