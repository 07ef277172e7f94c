"""--dp-size 2 on two GPUs: a replica on each, and greedy outputs as the reference path gives them (k3-tiny)."""

import pytest
import torch

from kestrel import Engine
from kestrel.models.registry import resolve
from tests.gpu.test_engine_gpu import SMALL_POOLS, assert_greedy_matches_reference

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def test_two_replicas_take_a_gpu_each_and_match_the_reference_path():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 4096, (int(n),), generator=g).tolist() for n in torch.randint(5, 120, (10,), generator=g)]
    params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    with Engine("k3-tiny", device="cuda", dtype="float32", skip_tokenizer_init=True, page_size=16, **SMALL_POOLS,
                cuda_graph_max_bs=16, dp_size=2) as engine:
        assert [i["device"] for i in engine.replicas.client.replica_info] == ["cuda:0", "cuda:1"]
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        assert engine.metrics()["generation_tokens_total"] == 16 * len(prompts)
    model = resolve("k3-tiny", torch.float32, "cuda", seed=0, progress=False).model  # the replicas' weights
    assert_greedy_matches_reference(model, prompts, outs, 16, 4)
