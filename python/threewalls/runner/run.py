"""The reference PyTorch runner: executes a scenario's model for real and writes a run directory.

    python3 -m threewalls.runner SCENARIO --out RUN_DIR            # one process
    torchrun --nproc_per_node=N -m threewalls.runner SCENARIO --out RUN_DIR

Training steps: for each micro-batch its input copy (host_to_device on the copy stream), forward and
backward; then the data-parallel gradient all-reduce in Megatron DDP buckets (dp > 1), the gradient
norm (all-reduced over the world), Adam on fp32 master weights, the loss all-reduce (dp > 1) and the
host's read of the loss. Inference steps: a prefill of the prompts, then decode steps with a KV
cache, each ending with the host's read of the sampled tokens. Warm-up steps run first and are not
recorded or numbered; step 0 is the first measured step, as in `threewalls sim`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from typing import Dict, List, Optional

import torch

from threewalls.errors import InputError
from threewalls.profiler import Profiler, SamplingConfig
from threewalls.profiler.sampling import resolve_ranks
from threewalls.runner import kernels
from threewalls.runner import scenario as scen
from threewalls.runner.model import Model
from threewalls.runner.ops import Ctx, embedding


def _ranks_from_env():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


# The key of a PyTorch run's host probe in run.json (settings.executor.device.host_probe); the same
# string as core/host_probe.hpp's kTorchEagerOpKey, which `threewalls compare` reads (a test checks).
TORCH_EAGER_OP_KEY = "torch_eager_op_us"


def host_probe() -> dict:
    """This process's host before the first step: bench.framework's eager_op_us (a one-element eager
    op issued while the device is busy; 7 repeats of 256 ops, about 10 ms), which `threewalls
    compare` sets against the profile's kernel_launch + framework_op (calibration::host_probe_scale)
    and `sim --host-scale` takes. Host speed moves between leases and processes (docs/python.md)."""
    from threewalls.bench.framework import eager_op
    return {TORCH_EAGER_OP_KEY: eager_op("cuda", 256, 7)["median_us"]}


def sampling_of(s: scen.Scenario, every: Optional[int] = None, enabled: Optional[bool] = None) -> SamplingConfig:
    p = s.profiler
    return SamplingConfig(
        enabled=p["enabled"] if enabled is None else enabled,
        start_step=p["start_step"], end_step=p["end_step"],
        record_every_n_steps=p["record_every_n_steps"] if every is None else every,
        flush_every_n_steps=p["flush_every_n_steps"],
        ranks=resolve_ranks(p["ranks"], s.world_size, representatives=[0]),
        granularity=p["granularity"])


class Buckets:
    """Megatron DDP's gradient buckets over this rank's parameters, in backward order: the output head,
    the layers from the last to the first, the embedding; a bucket closes once it holds
    grad_bucket_size parameters, and at the end (dense and expert parameters apart).

    Each bucket holds its parameters in one flat bf16 buffer (the model's parameters are views into
    it), its gradients in one flat fp32 buffer, and fp32 master weights: the whole bucket (gradients
    all-reduced), or, with the distributed optimizer, this rank's shard of it (gradients
    reduce-scattered, parameters all-gathered after the step). Buffers are padded to a multiple of
    the group size."""

    def __init__(self, model: Model, bucket_size: float, device, distributed: bool, dp: int, edp: int):
        L = model.m["num_layers"]
        order: List[int] = [L] + list(range(L - 1, -1, -1)) + [-1]
        by_layer: Dict[int, List[str]] = {}
        for name, layer in model.layer_of.items():
            by_layer.setdefault(layer, []).append(name)
        self.buckets = []  # (expert, closing_layer, [names])
        cur = {False: [], True: []}
        size = {False: 0, True: 0}

        def close(expert: bool, layer: int):
            if size[expert] > 0:
                self.buckets.append((expert, layer, cur[expert]))
            cur[expert] = []
            size[expert] = 0

        for layer in order:
            for name in by_layer.get(layer, []):
                expert = name in model.expert_params
                cur[expert].append(name)
                size[expert] += model.params[name].numel()
            if 0 <= layer < L:
                for expert in (False, True):
                    if size[expert] >= bucket_size:
                        close(expert, layer)
        close(False, -1)
        close(True, 0)
        self.distributed = distributed
        self.params, self.grads, self.masters, self.shards, self.sizes = [], [], [], [], []
        self.grad_views = []  # per bucket: each parameter's gradient slot in `grads`, in its shape
        dp_rank = model.rank if dp > 1 else 0  # tp = cp = pp = 1: the data-parallel rank is the rank
        edp_rank = model.rank // model.ep if edp > 1 else 0
        with torch.no_grad():
            for expert, layer, names in self.buckets:
                gs = edp if expert else dp
                gi = edp_rank if expert else dp_rank
                n = sum(model.params[x].numel() for x in names)
                npad = (n + gs - 1) // gs * gs
                pflat = torch.zeros(npad, dtype=model.dtype, device=device)
                off = 0
                for x in names:
                    p = model.params[x]
                    pflat[off:off + p.numel()].copy_(p.reshape(-1))
                    p.data = pflat[off:off + p.numel()].view_as(p)
                    off += p.numel()
                if distributed and gs > 1:
                    shard = (gi * (npad // gs), (gi + 1) * (npad // gs))
                else:
                    shard = (0, npad)
                master = pflat[shard[0]:shard[1]].float().clone()
                master.grad = torch.zeros_like(master)
                self.params.append(pflat)
                self.grads.append(torch.zeros(npad, dtype=torch.float32, device=device))
                views = []
                off = 0
                for x in names:
                    p = model.params[x]
                    views.append(self.grads[-1][off:off + p.numel()].view(p.shape))
                    off += p.numel()
                self.grad_views.append(views)
                self.masters.append(master)
                self.shards.append(shard)
                self.sizes.append(n)
        self.names = [names for _, _, names in self.buckets]

    def total_params(self) -> int:
        return sum(self.sizes)

    def shard_params(self) -> int:
        return sum(m.numel() for m in self.masters)


def run(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m threewalls.runner",
                                 description="Execute a scenario's model in PyTorch and write a run directory "
                                             "(docs/python.md).")
    ap.add_argument("scenario", help="scenario TOML (docs/scenario_reference.md)")
    ap.add_argument("--out", required=True, help="run directory to write (refused when it exists and is not empty)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing run directory's files")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="default: cuda when available, else cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                    help="parameter and activation type; default bf16 on CUDA (the scenario's precision), fp32 on "
                         "CPU")
    ap.add_argument("--steps", type=int, default=None, help="measured steps (default: run.steps)")
    ap.add_argument("--warmup-steps", type=int, default=None, help="default: run.warmup_steps")
    ap.add_argument("--record-every", type=int, default=None,
                    help="profiler.record_every_n_steps (default: the scenario's run.profiler)")
    ap.add_argument("--nvtx", choices=["sampled", "all", "off"], default="sampled")
    ap.add_argument("--wall-json", metavar="PATH",
                    help="also write every measured step's host wall time (from the end of the previous step, "
                         "each step ending with the host's read of the loss or tokens) and whether it was "
                         "recorded, as JSON; the unrecorded steps' times are what an uninstrumented eager "
                         "program takes (rank 0; printed either way)")
    ap.add_argument("--hf-config", metavar="CONFIG_JSON",
                    help="run transformers' own model class for this Hugging Face config.json (random weights, the "
                         "scenario's layers, one GPU, training) instead of the runner's model; the scenario gives "
                         "the batch, steps and profiler (threewalls.runner.hf)")
    ap.add_argument("--hf-params", choices=["fp32", "bf16"],
                    help="with --hf-config: the parameters' type; fp32 (default) is transformers' Trainer with "
                         "bf16=True (fp32 parameters, gradients and AdamW state, the forward under bf16 autocast), "
                         "bf16 a model loaded and trained in bf16")
    ap.add_argument("--torch-profile", metavar="TRACE_JSON",
                    help="also run the steps under torch.profiler (CPU and CUDA activity) with the profiler's "
                         "record_function ranges on, and write its Chrome trace here (rank r > 0: TRACE_JSON "
                         "with .rank<r> before .json); python3 -m threewalls.importers kineto reads it back")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    if args.hf_params and not args.hf_config:
        raise InputError("--hf-params applies to --hf-config runs only")
    s = scen.load(args.scenario, model_from_transformers=bool(args.hf_config))
    rank, world, local = _ranks_from_env()
    if world != s.world_size:
        raise InputError(f"{args.scenario}: the scenario's world is {s.world_size} GPUs (cluster.gpus_per_node x "
                         f"nodes); this run has {world} process(es) (torchrun --nproc_per_node={s.world_size})")
    device_kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_kind == "cuda":
        set_device_max_connections(args.scenario, s.run["cuda_device_max_connections"])
        if not torch.cuda.is_available():
            raise InputError("--device cuda: torch.cuda is not available")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if device_kind == "cuda" else "fp32")]
    steps = args.steps if args.steps is not None else s.run["steps"]
    warmup = args.warmup_steps if args.warmup_steps is not None else s.run["warmup_steps"]
    if steps < 1 or warmup < 0:
        raise InputError("--steps must be >= 1 and --warmup-steps >= 0")

    dist = None
    ep_group = dp_group = edp_group = None
    if world > 1:
        import torch.distributed as dist
        if device_kind == "cuda" and os.environ.get("NCCL_NVLS_ENABLE") is None:
            os.environ["NCCL_NVLS_ENABLE"] = "0"
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo",
                                **({"device_id": device} if device_kind == "cuda" and _has_device_id() else {}))
        dp_group = dist.group.WORLD
        ep = s.ep
        for g in range(world // ep):
            grp = dist.new_group(list(range(g * ep, (g + 1) * ep)))
            if rank // ep == g:
                ep_group = grp
        for e in range(ep):
            grp = dist.new_group(list(range(e, world, ep)))
            if rank % ep == e:
                edp_group = grp
    torch.manual_seed(s.run["seed"] + rank)
    if args.hf_config:
        from threewalls.runner import hf
        model, runner_settings = hf.build(args, s, device, dtype)
    else:
        model = Model(s, rank=rank, device=device, dtype=dtype, ep_group=ep_group, seed=s.run["seed"])
        runner_settings = model.settings()
    if device_kind == "cuda":
        # The run's peak memory is its steps' (what the memory model predicts), not the model's
        # construction: drawing the weights stages each layer's experts in fp32 beside their bf16 copies.
        torch.cuda.reset_peak_memory_stats(device)
    settings = {"steps": steps, "warmup_steps": warmup, "runner": runner_settings,
                "executor": {"name": "threewalls.runner (PyTorch eager)", "torch": torch.__version__,
                             "world_size": world, "backend": ("nccl" if device_kind == "cuda" else "gloo")
                             if world > 1 else None}}
    if device_kind == "cuda":
        settings["executor"]["device"] = {"host_probe": host_probe(),
                                          "cuda_device_max_connections": os.environ["CUDA_DEVICE_MAX_CONNECTIONS"]}
    prof = Profiler(args.out, rank=rank, world_size=world, sampling=sampling_of(s, args.record_every),
                    scenario={"name": s.name, "path": args.scenario, "hash": s.hash}, seed=s.run["seed"],
                    settings=settings, overwrite=args.overwrite, nvtx=args.nvtx, use_cuda=device_kind == "cuda",
                    annotate=bool(args.torch_profile),
                    rank_classes=[{"id": 0, "label": "stage 0", "ranks": list(range(world)), "pp_stage": 0}])
    if not args.hf_config:
        model.name_streams(prof)
    c = Ctx(prof, rank)
    copy_stream = torch.cuda.Stream() if device_kind == "cuda" else None
    if copy_stream is not None:
        prof.name_stream(copy_stream, "copy")
    gen = torch.Generator().manual_seed(s.run["seed"] * 1000 + rank)
    try:
        walls = StepWalls()
        with _torch_profile(args.torch_profile, rank, device_kind):
            if args.hf_config:
                step_inputs = None
                hf.train(s, model, prof, device, dtype, gen, steps, warmup, walls)
                tokens = s.step["global_batch_size"] * s.step["seq_length"]
            elif s.training:
                step_inputs = None
                _train(s, model, prof, c, device, copy_stream, gen, steps, warmup, dist, dp_group, edp_group, walls)
                tokens = s.step["global_batch_size"] * s.step["seq_length"]
            else:
                step_inputs = _infer(s, model, prof, c, device, copy_stream, gen, steps, warmup, walls)
                tokens = None
        if device_kind == "cuda":
            torch.cuda.synchronize()
        prof.finish(tokens_per_step=tokens, gpu=s.cluster["gpu"], gpu_peak_flops=scen.calibration_peak_flops(s),
                    step_inputs=step_inputs, model_flops_from_records=not args.hf_config)
    except BaseException:
        prof.abandon()
        raise
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(f"run directory {args.out}: {steps} step(s) of {s.name} on {world} rank(s) ({device})")
        print(walls.line())
        if args.wall_json:
            walls.write(args.wall_json)
    return 0


class StepWalls:
    """Host wall time of each measured step: from the end of the step before (warm-up included) to
    the end of this one, every step ending with a device-to-host read (the loss or the sampled
    tokens), so each is the step's whole time; split by whether the profiler recorded it."""

    def __init__(self):
        self.steps: List[Dict[str, object]] = []
        self._t = time.perf_counter()

    def end(self, step: Optional[int], recorded: bool) -> None:
        t = time.perf_counter()
        if step is not None:
            self.steps.append({"step": step, "recorded": recorded, "wall_ms": (t - self._t) * 1e3})
        self._t = t

    def medians(self) -> Dict[str, Optional[float]]:
        import statistics
        out = {}
        for key, rec in (("recorded", True), ("unrecorded", False)):
            xs = [x["wall_ms"] for x in self.steps if x["recorded"] is rec]
            out[key] = statistics.median(xs) if xs else None
        return out

    def line(self) -> str:
        m = self.medians()
        n = {k: sum(1 for x in self.steps if x["recorded"] is (k == "recorded")) for k in m}
        return "step wall time (host clock), median: " + ", ".join(
            f"{k} {'-' if v is None else f'{v:.1f} ms'} ({n[k]} steps)" for k, v in m.items())

    def write(self, path: str) -> None:
        import json
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"steps": self.steps, "median_ms": self.medians()}, f, indent=1)
            f.write("\n")


class _torch_profile:
    """torch.profiler around the steps when a trace path is given, exported as a Chrome trace."""

    def __init__(self, path: Optional[str], rank: int, device_kind: str):
        self.path = path if not path or rank == 0 else re.sub(r"(\.json)?$", f".rank{rank}.json", path, count=1)
        self.device_kind = device_kind
        self.prof = None

    def __enter__(self):
        if self.path:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device_kind == "cuda" else [])
            self.prof = profile(activities=acts)
            self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.prof is not None:
            self.prof.__exit__(*exc)
            if exc[0] is None:
                self.prof.export_chrome_trace(self.path)
        return False


def _has_device_id() -> bool:
    import inspect
    import torch.distributed as dist
    try:
        return "device_id" in inspect.signature(dist.init_process_group).parameters
    except (TypeError, ValueError):
        return False


def set_device_max_connections(path: str, want: int) -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS from the scenario's run.cuda_device_max_connections, set before the
    process creates its CUDA context (torch.cuda.is_available() does not create one); an environment
    that already sets another value is an error, as in threewalls run."""
    have = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if have is None:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(want)
    elif have.strip() != str(want):
        raise InputError(f"{path}: the environment sets CUDA_DEVICE_MAX_CONNECTIONS={have} but the scenario's "
                         f"run.cuda_device_max_connections is {want} (8 when the scenario does not say); set the "
                         "key to the value the run should use (1..32) or unset the variable")


def _h2d(c: Ctx, prof, host_tensors, device, copy_stream, sync_after_copy: bool):
    """The input copies of a micro-batch or step (host_to_device, on the copy stream; coarse view)."""
    nbytes = float(sum(t.numel() * t.element_size() for t in host_tensors))
    info = c.info("host_to_device", wall="memory", nbytes=nbytes, coarse="host_to_device", layer=None)
    if copy_stream is None:  # CPU: the copy is synchronous; the sync is then its own (tiny) host op
        with prof.phase(info):
            out = [t.to(device) for t in host_tensors]
        if sync_after_copy:
            with prof.host_phase(c.info("host_to_device_sync", wall="host", host=True, layer=None)):
                pass
        return out
    with torch.cuda.stream(copy_stream):
        with prof.phase(info, stream=copy_stream):
            out = [t.to(device, non_blocking=True) for t in host_tensors]
    if sync_after_copy:
        with prof.host_phase(c.info("host_to_device_sync", wall="host", host=True, layer=None)):
            copy_stream.synchronize()
    torch.cuda.current_stream().wait_stream(copy_stream)
    for t in out:
        t.record_stream(torch.cuda.current_stream())
    return out


def train_forward(s, model: Model, c: Ctx, d_ids, d_labels):
    """One micro-batch's forward of a training step: the loss (c.mb set by the caller)."""
    b, sq = d_ids.shape
    x = embedding(c, d_ids, model.params["embedding"])
    for li in range(s.model["num_layers"]):
        c.layer = li
        x = model.attention(c, x, b, sq, decode=False)
        x = model.mlp(c, x)
    c.layer = None
    logits = model.head_logits(c, x)
    return model.loss(c, logits, d_labels)


def _train(s, model: Model, prof, c: Ctx, device, copy_stream, gen, steps, warmup, dist, dp_group, edp_group,
           walls: StepWalls):
    t = s.step
    b, sq = t["micro_batch_size"], t["seq_length"]
    M = s.num_microbatches
    V = s.model["vocab_size"]
    dp, ep = s.dp, s.ep
    edp = s.world_size // ep
    world = s.world_size
    distributed = bool(t["use_distributed_optimizer"])
    bk = Buckets(model, t["grad_bucket_size"], device, distributed, dp, edp)
    opt = kernels.adam(bk.masters, device)
    fused = bool(opt.defaults.get("fused"))
    runner_settings = prof.header.get("settings", {}).get("runner") if prof.header else None
    if runner_settings is not None:
        runner_settings["optimizer"] = ("distributed " if distributed and world > 1 else "") + (
            "Adam (fused)" if fused else "Adam")
        runner_settings["gradients"] = "bf16 autograd gradients copied into fp32 bucket buffers after backward"
    pin = device.type == "cuda"
    shard = bk.shard_params()
    gloo = dist is not None and device.type == "cpu"

    def reduce_grads(i, expert, layer, group, gsize):
        buf = bk.grads[i]
        buf.mul_(1.0 / gsize)
        pre = "edp" if expert else "dp"
        gid = (model.rank % ep) if expert else 0
        lay = None if layer < 0 else layer
        lo, hi = bk.shards[i]
        if distributed:
            with prof.phase(c.info(pre + "_grad_reduce_scatter", wall="communication", nbytes=buf.numel() * 4.0,
                                   group="edp" if expert else "dp_cp", group_id=gid, layer=lay)):
                if gloo:  # gloo has no reduce-scatter: all-reduce, keep the shard
                    dist.all_reduce(buf, group=group)
                else:
                    dist.reduce_scatter_tensor(bk.masters[i].grad, buf, group=group)
            if gloo:
                bk.masters[i].grad.copy_(buf[lo:hi])
        else:
            with prof.phase(c.info(pre + "_grad_allreduce", wall="communication", nbytes=buf.numel() * 4.0,
                                   group="edp" if expert else "dp_cp", group_id=gid, layer=lay)):
                dist.all_reduce(buf, group=group)

    def gather_params(i, expert, layer, group):
        pflat = bk.params[i]
        lo, hi = bk.shards[i]
        pre = "edp" if expert else "dp"
        gid = (model.rank % ep) if expert else 0
        with prof.phase(c.info(pre + "_param_allgather", wall="communication", nbytes=pflat.numel() * 2.0,
                               group="edp" if expert else "dp_cp", group_id=gid, layer=None if layer < 0 else layer)):
            if gloo:
                parts = list(pflat.chunk(dist.get_world_size(group)))
                dist.all_gather(parts, pflat[lo:hi].clone(), group=group)
            else:
                dist.all_gather_into_tensor(pflat, pflat[lo:hi], group=group)

    for i in range(warmup + steps):
        measured = i >= warmup
        step = i - warmup
        if measured:
            prof.begin_step(step)
        recorded = prof.recording
        loss_sum = torch.zeros((), device=device, dtype=torch.float32)
        for mb in range(M):
            c.mb = mb
            ids = torch.randint(0, V, (b, sq), generator=gen)
            labels = torch.randint(0, V, (b, sq), generator=gen)
            mask = torch.ones(b, sq, dtype=torch.int64)
            pos = torch.arange(sq, dtype=torch.int64).expand(b, sq).contiguous()
            host = [x.pin_memory() if pin else x for x in (ids, labels, mask, pos)]
            d_ids, d_labels, _, _ = _h2d(c, prof, host, device, copy_stream, t["sync_after_copy"])
            loss = train_forward(s, model, c, d_ids, d_labels)
            (loss / M).backward()
            loss_sum += loss.detach()
        c.mb = None
        with torch.no_grad():
            # Gradients into the fp32 buckets (Megatron accumulates into fp32 main grads; a PyTorch
            # program with fp32 masters copies them). Recorded as main_grad_copy where the scenario's
            # StepGraph has it (run.framework = "pytorch_eager"); else a gap between records.
            local = float(sum(g.numel() for g in bk.grads))
            grad_copy = (prof.phase(c.info("main_grad_copy", wall="memory", nbytes=local * 6.0, layer=None))
                         if s.run["framework"] == "pytorch_eager" else contextlib.nullcontext())
            with grad_copy:
                for bi, names in enumerate(bk.names):
                    ps = [model.params[n] for n in names]
                    dst = bk.grad_views[bi]
                    if all(p.grad is not None for p in ps):
                        kernels.gradients_to_main(dst, [p.grad for p in ps])
                    else:
                        for d, p in zip(dst, ps):
                            d.copy_(p.grad) if p.grad is not None else d.zero_()
                    for p in ps:
                        p.grad = None
                    if not (distributed and (edp if bk.buckets[bi][0] else dp) > 1):
                        bk.masters[bi].grad = bk.grads[bi]
            for bi, (expert, layer, _names) in enumerate(bk.buckets):
                gsize = edp if expert else dp
                if gsize > 1:
                    reduce_grads(bi, expert, layer, edp_group if expert else dp_group, gsize)
            with prof.phase(c.info("optimizer_grad_norm", wall="memory", nbytes=shard * 4.0, layer=None)):
                sq_norm = kernels.squared_norm(bk.masters)
            if world > 1:
                with prof.phase(c.info("optimizer_grad_norm_allreduce", wall="communication", nbytes=4.0,
                                       group="world", group_id=0, layer=None)):
                    dist.all_reduce(sq_norm)
            with prof.phase(c.info("optimizer_step", wall="memory", nbytes=shard * 30.0, layer=None)):
                kernels.clipped_step(opt, bk.masters, sq_norm, bk.params, bk.shards)
            if distributed:
                for bi in range(len(bk.buckets) - 1, -1, -1):
                    expert, layer, _names = bk.buckets[bi]
                    if (edp if expert else dp) > 1:
                        gather_params(bi, expert, layer, edp_group if expert else dp_group)
            if dp > 1:
                metrics = torch.stack([loss_sum, torch.tensor(float(M), device=device)])
                with prof.phase(c.info("training_metrics_allreduce", wall="communication", nbytes=8.0,
                                       group="dp_cp", group_id=0, coarse="training_metrics", layer=None)):
                    dist.all_reduce(metrics, group=dp_group)
                loss_sum = metrics[0]
            with prof.host_phase(c.info("training_metrics_read", wall="host", nbytes=8.0,
                                        coarse="training_metrics", host=True, layer=None), waits_for_device=True):
                float(loss_sum.item())
        if measured:
            prof.end_step()
        walls.end(step if measured else None, recorded)


def _infer(s, model: Model, prof, c: Ctx, device, copy_stream, gen, steps, warmup,
           walls: StepWalls) -> Dict[int, Dict[str, float]]:
    t = s.step
    b, prompt = t["batch_size"], t["prompt_length"]
    V = s.model["vocab_size"]
    pin = device.type == "cuda"
    step_inputs: Dict[int, Dict[str, float]] = {}
    sampled: Optional[List[int]] = None

    def one(step_index: int, measured: bool):
        nonlocal sampled
        kind, pos = s.infer_step_kind(step_index)
        if kind == "decode" and sampled is None:
            kind = "prefill"  # a decode needs its prompt's cache: warm-up restarts at a prefill
        if measured:
            prof.begin_step(step_index)
        recorded = prof.recording
        if kind == "prefill":
            ids = torch.randint(0, V, (b, prompt), generator=gen)
            sq = prompt
        else:
            ids = torch.tensor(sampled, dtype=torch.int64).view(b, 1)
            sq = 1
        host = [ids.pin_memory() if pin else ids]
        (d_ids,) = _h2d(c, prof, host, device, copy_stream, t["sync_after_copy"])
        with torch.no_grad():
            x = embedding(c, d_ids, model.params["embedding"])
            for li in range(s.model["num_layers"]):
                c.layer = li
                x = model.attention(c, x, b, sq, decode=kind == "decode")
                x = model.mlp(c, x)
            c.layer = None
            last = x.view(b, sq, -1)[:, -1]
            logits = model.head_logits(c, last)
            tok = model.sample(c, logits)
            with prof.host_phase(c.info("sampled_token_read", wall="host", host=True, layer=None),
                                 waits_for_device=True):
                sampled = tok.tolist()
        model.kv_len = prompt if kind == "prefill" else model.kv_len + 1
        if measured:
            prof.end_step()
            step_inputs[step_index] = {"tokens": float(b * sq)}
        walls.end(step_index if measured else None, recorded)

    for i in range(warmup):
        one(i, False)
    sampled = None
    model.kv_len = 0
    model.kv = [None] * len(model.kv)
    for step in range(steps):
        one(step, True)
    return step_inputs


def main() -> None:
    sys.exit(run())
