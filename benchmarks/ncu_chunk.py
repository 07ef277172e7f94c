"""kda_chunked and fla's chunk_kda under Nsight Compute: one call each at T = 8192 (4 varlen sequences), K = V = 128,
bf16, after warm-up (compiles and fla's autotuning happen outside the profiled range).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats python3 benchmarks/ncu_chunk.py --heads 96
"""

import argparse

import torch

from kestrel.ops.kda import reference as kref, triton_chunk as kda_t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=96)
    ap.add_argument("--no-fla", action="store_true")
    args = ap.parse_args()
    H, K, lens = args.heads, 128, [1000, 3000, 192, 4000]
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    T, dev, bf = cu[-1], "cuda", torch.bfloat16
    q = kref.l2norm(torch.randn(T, H, K, device=dev)).to(bf)
    k = kref.l2norm(torch.randn(T, H, K, device=dev)).to(bf)
    v = torch.randn(T, H, K, device=dev).to(bf)
    g = -5 * torch.rand(T, H, K, device=dev)
    beta = torch.rand(T, H, device=dev)
    h0 = torch.randn(len(lens), H, K, K, device=dev) * 0.1
    runs = [lambda: kda_t.kda_chunked(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0)]
    if not args.no_fla:
        import fla.ops.kda as fla
        cu_t = torch.tensor(cu, device=dev, dtype=torch.long)
        runs.append(lambda: fla.chunk_kda(q[None], k[None], v[None], g[None], beta[None], scale=K**-0.5,
                                          initial_state=h0, output_final_state=True, cu_seqlens=cu_t, safe_gate=True,
                                          lower_bound=-5.0))
    for run in runs:
        for _ in range(3):
            run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for run in runs:
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
