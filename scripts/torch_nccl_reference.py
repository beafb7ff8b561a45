#!/usr/bin/env python3
"""NCCL bus bandwidth through PyTorch, as a reference for threewalls' own collective microbenchmarks.

Run on a GPU machine with PyTorch, one process per GPU:
    NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --nproc_per_node=N scripts/torch_nccl_reference.py [--sizes-mib 64,256,1024]

Prints, on rank 0, one line per (collective, size): the mean time of --iters back-to-back calls timed
with CUDA events after --warmup calls, the algorithm bandwidth S/t and the bus bandwidth with
nccl-tests' factors (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n), where S is
the nccl-tests size (the whole buffer of one rank, bf16). It measures what the NCCL reference facts
(docs/architecture.md, "Reference facts") measure, on the machine at hand, so the calibration's peaks can be compared with the
best rate that machine gives through another caller of the same library.
"""
import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mib", default="64,256,1024")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        raise SystemExit("set NCCL_NVLS_ENABLE=0 (NVLink multicast must stay off on these machines)")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    n = dist.get_world_size()
    rank = dist.get_rank()
    if rank == 0:
        print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{n} x {torch.cuda.get_device_name(local)}", flush=True)
    factors = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
               "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n}
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        size = mib << 20
        count = size // 2  # bf16 elements of the whole buffer
        count -= count % n
        full = torch.randn(count, dtype=torch.bfloat16, device="cuda")
        out = torch.empty_like(full)
        part = torch.empty(count // n, dtype=torch.bfloat16, device="cuda")
        ops = {
            "all_reduce": lambda: dist.all_reduce(full),
            "all_gather": lambda: dist.all_gather_into_tensor(out, full[: count // n]),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
            "all_to_all": lambda: dist.all_to_all_single(out, full),
        }
        for name, op in ops.items():
            for _ in range(args.warmup):
                op()
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                op()
            end.record()
            torch.cuda.synchronize()
            t = start.elapsed_time(end) / 1e3 / args.iters
            tt = torch.tensor([t], device="cuda")
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            if rank == 0:
                s = count * 2
                alg = s / tt.item() / 1e9
                print(f"{name:15s} {s / 2**20:9.1f} MiB  {tt.item() * 1e3:8.4f} ms  algbw {alg:7.1f} GB/s  "
                      f"busbw {alg * factors[name]:7.1f} GB/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
