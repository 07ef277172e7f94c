"""What a kernel boundary costs on the decode chain, and whether a grid-wide barrier inside one persistent kernel
costs less (docs/kernels.md, "Targets: met and missed", next step 1).

A chain of L dependent one-row GEMVs, y_{i+1} = W_i y_i (W_i [N, N] bf16, fp32 accumulation, y rounded to bf16 each
step), run three ways in the same process:
- `pdl`: L launches of the model's GEMV (kestrel.ops.linear.triton.linear) under programmatic dependent launch,
  captured in one CUDA graph: the decode graph's form, each weight tile loaded before the kernel's wait;
- `persistent`: one launch of one program per SM that runs the L GEMVs with a grid-wide barrier between them (an
  acquire/release counter in global memory), each program loading its next weight tiles before it waits at the
  barrier, as the PDL kernels load theirs before their wait;
- `floor`: the chain's weight bytes at the device-to-device copy bandwidth measured in the same run.

Both chains are checked against an fp32 torch chain (bf16-rounded like the kernels) before they are timed. The
table's last columns are the time a step spends beyond its bytes floor, per boundary: the figure a persistent
per-layer decode kernel would save on each of the decode step's ~300 boundaries.

    PYTHONPATH=. python benchmarks/persistent_chain.py --dims 512,1024,2048 --layers 96
"""

import argparse
import statistics

import torch
import triton
import triton.language as tl

from benchmarks.common import pdl_device, rel_err, replay_ms, stamp


@triton.jit
def _wait(sync_ptr, target):
    """Spin until the barrier counter reaches target (acquire: the writes released before it are visible)."""
    c = tl.atomic_add(sync_ptr, 0, sem="acquire")
    while c < target:
        c = tl.atomic_add(sync_ptr, 0, sem="acquire")


@triton.jit
def _chain_kernel(w_ptr, y_ptr, sync_ptr, L, N: tl.constexpr, BN: tl.constexpr):
    """y[i + 1] = W[i] @ y[i] for i < L; program g owns rows [g BN, (g + 1) BN) of every GEMV. Every program must be
    resident at once (the caller keeps the grid within one wave)."""
    G = tl.num_programs(0)
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, N)
    for i in range(L):
        # the weight tile first: it does not depend on the barrier
        w = tl.load(w_ptr + i.to(tl.int64) * N * N + rows[:, None] * N + cols[None, :], mask=rows[:, None] < N,
                    other=0.0)
        if i > 0:
            _wait(sync_ptr, i * G)
        x = tl.load(y_ptr + i * N + cols, cache_modifier=".cg").to(tl.float32)
        acc = tl.sum(w.to(tl.float32) * x[None, :], 1)
        tl.store(y_ptr + (i + 1) * N + rows, acc.to(y_ptr.dtype.element_ty), mask=rows < N)
        tl.debug_barrier()  # every thread's stores before the release
        tl.atomic_add(sync_ptr, 1, sem="release")
    # the last program out re-arms the counters for the next launch
    if tl.atomic_add(sync_ptr + 1, 1) == G - 1:
        tl.atomic_xchg(sync_ptr, 0)
        tl.atomic_xchg(sync_ptr + 1, 0)


def persistent_chain(w: torch.Tensor, y: torch.Tensor, sync: torch.Tensor, bn: int):
    L, N, _ = w.shape
    _chain_kernel[(triton.cdiv(N, bn),)](w, y, sync, L, N=N, BN=bn, num_warps=8 if bn * N >= 16384 else 4)
    return y


def pdl_chain(w: torch.Tensor, x: torch.Tensor, out: list[torch.Tensor]) -> None:
    """The model's GEMV launches, one a step, each output a fresh tensor (no copies between them); out gets x and
    the L outputs."""
    from kestrel.ops.linear.triton import linear

    out[:] = [x.view(1, -1)]
    for i in range(w.shape[0]):
        out.append(linear(out[-1], w[i]))


def reference_chain(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out = [x]
    for i in range(w.shape[0]):
        out.append((w[i].float() @ out[-1].float()).to(x.dtype))
    return torch.stack(out)



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", default="512,1024,2048", help="N of the N x N GEMVs, comma-separated")
    ap.add_argument("--layers", type=int, default=96, help="GEMVs in the chain")
    ap.add_argument("--rows", default="4,16", help="rows per tile of the persistent kernel, comma-separated")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="turn-about rounds (medians reported)")
    args = ap.parse_args()
    dev, sms, bw = pdl_device()
    print(f"{stamp()} {torch.cuda.get_device_name(dev)}, {sms} SMs, copy bandwidth {bw / 1e12:.2f} TB/s, "
          f"{args.layers} GEMVs a chain")
    rows = []
    for n in map(int, args.dims.split(",")):
        L = args.layers
        w = (torch.randn(L, n, n, device=dev) / n ** 0.5).to(torch.bfloat16)
        x = torch.randn(n, device=dev).to(torch.bfloat16)
        ref = reference_chain(w, x)
        # each side: (launch the chain, its outputs [L + 1, N] after the launch)
        held: list[torch.Tensor] = []
        sides = {"pdl": (lambda w=w, x=x, held=held: pdl_chain(w, x, held), lambda held=held: torch.cat(held))}
        sync = torch.zeros(2, dtype=torch.int32, device=dev)
        for bn in map(int, args.rows.split(",")):
            if triton.cdiv(n, bn) > 4 * sms:  # (one wave: every program resident)
                continue
            yp = torch.zeros(L + 1, n, dtype=torch.bfloat16, device=dev)
            yp[0] = x
            sides[f"persistent/{bn}"] = (lambda yp=yp, w=w, bn=bn: persistent_chain(w, yp, sync, bn),
                                         lambda yp=yp: yp)
        graphs = {}
        for name, (run, result) in sides.items():
            run()
            torch.cuda.synchronize()
            err = rel_err(result(), ref)
            assert err < 2e-2, f"{name} at N = {n}: relative error {err:.3g} against the torch chain"
            assert sync.eq(0).all(), "the persistent kernel left its counters armed"
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run()
            graphs[name] = (g, err)
        times = {name: [] for name in graphs}
        for _ in range(args.rounds):
            for name, (g, _) in graphs.items():
                times[name].append(replay_ms(g, args.replays))
        floor_ms = L * n * n * 2 / bw * 1e3
        for name, (g, err) in graphs.items():
            t = statistics.median(times[name])
            rows.append((n, name, floor_ms, t, err, (t - floor_ms) * 1e3 / L))
        del w, graphs
        torch.cuda.empty_cache()
    print("| N | chain | floor ms | ms | of floor | rel err vs torch | us beyond floor per GEMV |")
    print("|---|---|---|---|---|---|---|")
    for n, name, floor_ms, t, err, per in rows:
        print(f"| {n} | {name} | {floor_ms:.3f} | {t:.3f} | {floor_ms / t:.1%} | {err:.1e} | {per:.2f} |")


if __name__ == "__main__":
    main()
