"""The CPU engine's malloc settings (kestrel/engine/host_malloc.py): a repeated k3-small prefill forward, whose
temporaries are megabytes each, touches no new pages once the heap holds them. Each side runs in a fresh process
(the settings are process-wide and stay set); page faults are counted, nothing is timed."""

import subprocess
import sys

import pytest

from kestrel.engine import host_malloc

SCRIPT = """
import resource, sys, torch
from kestrel.engine import host_malloc
from kestrel.models.forward_batch import ForwardBatch
from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.presets import init_random, preset_config
if sys.argv[1] == "tuned":
    assert host_malloc.keep_freed_memory()
torch.set_num_threads(1)
torch.manual_seed(0)
model = K3ForCausalLM(preset_config("k3-small"))
init_random(model)
faults = []
with torch.inference_mode():
    for _ in range(5):
        fb = ForwardBatch.full_sequences(torch.randint(0, 4096, (8, 256)))
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        model(fb)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(sum(faults[-2:]))
"""


def steady_faults(mode: str) -> int:
    """Minor page faults of the last two of five forwards (the first ones grow the heap)."""
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(host_malloc.mallopt() is None, reason="glibc's mallopt")
def test_prefill_temporaries_stay_in_the_heap():
    tuned, default = steady_faults("tuned"), steady_faults("default")
    # (the heap may still grow a little as it fragments: 0-5,000 here)
    assert tuned < default / 10, (tuned, default)
    # glibc's defaults fault ~50,000 pages in again every forward here: the case the settings fix
    assert default > 10000, (tuned, default)
