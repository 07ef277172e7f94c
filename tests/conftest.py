import pytest
import torch

from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.presets import init_random, preset_config

# the suite runs two processes on two cores: intra-op threads would only fight each other (5x slower here)
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny64() -> K3ForCausalLM:
    """k3-tiny with every feature on, float64, random weights: the exactness workhorse."""
    torch.manual_seed(0)
    model = K3ForCausalLM(preset_config("k3-tiny"), dtype=torch.float64)
    init_random(model, seed=0)
    return model.eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def argmax_edge_rows(dtype, device="cpu") -> torch.Tensor:
    """[37, 301] rows for argmax tests: few distinct values (many ties, where the first index must win), NaNs (the
    first NaN wins), infinities, a row of -inf, signed zeros."""
    x = torch.randint(-3, 4, (37, 301), device=device).to(dtype)
    x[3, 17] = x[3, 200] = float("nan")
    x[5, :] = float("-inf")
    x[6, 40] = x[6, 9] = float("inf")
    x[7, 250] = float("nan")
    x[7, 10] = float("inf")
    x[8] = -0.0
    x[8, 100] = 0.0
    return x
