"""scripts/profiler_queue_probe.py N OUT_DIR (on a GPU machine, from the repository root): the Python profiler on a device-bound two-stream loop, with CUDA_DEVICE_MAX_CONNECTIONS = argv[1].

Each step: stream a runs one long single-block kernel (torch.cuda._sleep, about 6 ms), stream b
twenty 4096^3 bf16 GEMMs (about 4 ms) beside it; the steps end with a synchronize. Modes: plain (no
profiler), recorded with the profiler's default stamps (a marker on the stream, the timing event on
a timer stream: stamps="shadow"), and stamps="stream" (the timing event on the op's stream), every
step recorded, one phase per kernel. Prints the median step wall of each mode (ms), 20 steps after 5."""
import json
import os
import sys
import tempfile
import time

os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = sys.argv[1]
out = sys.argv[2]
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.getcwd(), "python"))
from threewalls.profiler.profiler import Profiler  # noqa: E402
from threewalls.profiler.sampling import SamplingConfig  # noqa: E402

torch.cuda.init()
a, b = torch.cuda.Stream(), torch.cuda.Stream()
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
CYCLES = 12_000_000  # about 6 ms at 2 GHz
GEMMS = 20


def one_step(prof):
    def ph(name):
        return prof.phase(name) if prof else _Nul()
    with torch.cuda.stream(a):
        with ph("a_sleep"):
            torch.cuda._sleep(CYCLES)
    with torch.cuda.stream(b):
        y = x
        for i in range(GEMMS):
            with ph("b_gemm"):
                y = torch.mm(x, w)
    torch.cuda.current_stream().wait_stream(a)
    torch.cuda.current_stream().wait_stream(b)


class _Nul:
    def __enter__(self):
        return self

    def __exit__(self, *e):
        return False


def run(mode):
    prof = None
    if mode != "plain":
        d = tempfile.mkdtemp()
        prof = Profiler(os.path.join(d, "run"), sampling=SamplingConfig(record_every_n_steps=1, flush_every_n_steps=5),
                        nvtx="off", stamps="shadow" if mode == "shadow" else "stream")
    walls = []
    for step in range(25):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if prof:
            with prof.step(step):
                one_step(prof)
        else:
            one_step(None)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    if prof:
        prof.finish()
    w = sorted(walls[5:])
    return w[len(w) // 2], walls


# alone: a's kernel, then b's GEMMs, each on its own (device-bound references)
def alone():
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.cuda.stream(a):
        torch.cuda._sleep(CYCLES)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    with torch.cuda.stream(b):
        for i in range(GEMMS):
            torch.mm(x, w)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


for _ in range(3):
    alone()
sa, gb = alone()
res = {"connections": int(sys.argv[1]), "sleep_alone_ms": sa, "gemms_alone_ms": gb}
for rep in range(2):
    for mode in ("plain", "shadow", "stream"):
        med, walls = run(mode)
        res.setdefault(mode, []).append(med)
        res.setdefault(mode + "_walls", []).append(walls)
print(json.dumps({k: v for k, v in res.items() if not k.endswith("_walls")}))
json.dump(res, open(os.path.join(out, f"pq_{sys.argv[1]}.json"), "w"))
