#!/usr/bin/env python3
"""All-to-all time by how it is issued: PyTorch's NCCL on every GPU of one host.

Run with torchrun (one process per GPU):

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=4 scripts/nccl_all_to_all_probe.py \
        --sizes-mib 32,64,96,128,192,256,512 --json OUT.json

For each size (bytes each rank sends in total, bf16, `all_to_all_single`) it times the collective
four ways, each the median over `--samples` samples of the slowest rank:

- `isolated`: a small all-reduce lines the ranks up, then one all-to-all between two CUDA events;
- `back_to_back`: 20 all-to-alls between two events, the time divided by 20;
- `after_gemm`: a bf16 GEMM (about 0.3 ms) and then the all-to-all on the same stream, the
  all-to-all timed alone (as a training step issues it, behind compute);
- `fresh_buffers`: as `isolated`, with input and output tensors allocated for each sample.

It prints one row per (size, mode) and, with --json, writes them.
"""

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mib", default="32,64,96,128,192,256,512",
                   help="comma-separated sizes in MiB (bytes each rank sends in total)")
    p.add_argument("--samples", type=int, default=30, help="samples per (size, mode)")
    p.add_argument("--json", help="write the rows to this file (rank 0)")
    return p.parse_args()


def slowest(t_ms):
    """The slowest rank's time of this sample."""
    t = torch.tensor([t_ms], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def line_up():
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)


def main():
    args = parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    sizes = [float(s) for s in args.sizes_mib.split(",") if s]
    a = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    rows = []
    for mib in sizes:
        elems = int(mib * 1024 * 1024 / 2) // world * world
        inp = torch.randn(elems, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(inp)
        for _ in range(3):  # warm-up: connections, buffers
            dist.all_to_all_single(out, inp)
        torch.cuda.synchronize()
        for mode in ("isolated", "back_to_back", "after_gemm", "fresh_buffers"):
            times = []
            for _ in range(args.samples):
                line_up()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if mode == "isolated":
                    s.record()
                    dist.all_to_all_single(out, inp)
                    e.record()
                    reps = 1
                elif mode == "back_to_back":
                    reps = 20
                    s.record()
                    for _ in range(reps):
                        dist.all_to_all_single(out, inp)
                    e.record()
                elif mode == "after_gemm":
                    reps = 1
                    torch.mm(a, b)
                    s.record()
                    dist.all_to_all_single(out, inp)
                    e.record()
                else:
                    reps = 1
                    fin = torch.randn(elems, device="cuda", dtype=torch.bfloat16)
                    fout = torch.empty_like(fin)
                    s.record()
                    dist.all_to_all_single(fout, fin)
                    e.record()
                torch.cuda.synchronize()
                times.append(slowest(s.elapsed_time(e) / reps))
            med = statistics.median(times)
            q = statistics.quantiles(times, n=10)
            row = {"size_mib": mib, "bytes": elems * 2, "ranks": world, "mode": mode, "median_us": med * 1e3,
                   "p10_us": q[0] * 1e3, "p90_us": q[-1] * 1e3, "samples": len(times),
                   "algbw_GBps": elems * 2 / (med * 1e-3) / 1e9}
            rows.append(row)
            if rank == 0:
                print(f"{mib:8.1f} MiB  {mode:14s} median {row['median_us']:9.1f} us  p10 {row['p10_us']:9.1f}"
                      f"  p90 {row['p90_us']:9.1f}  algbw {row['algbw_GBps']:6.1f} GB/s", flush=True)
        del inp, out
    if rank == 0:
        print(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{torch.cuda.get_device_name()}, {world} ranks", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"torch": torch.__version__, "nccl": list(torch.cuda.nccl.version()),
                           "device": torch.cuda.get_device_name(), "ranks": world, "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
