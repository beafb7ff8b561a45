"""Reading a scenario TOML (docs/scenario_reference.md) for the PyTorch reference runner.

The scenario language belongs to the C++ registry (scenarios/src/registry.cpp), which validates
every scenario `threewalls sim` reads. This module reads the same files with tomllib and accepts the
part of the language that the runner executes; every other key, and every value of a supported key
that the runner does not execute, is refused with a message naming the file, the key, the value and
what the runner supports. Nothing is ignored silently. The defaults below are the registry's
(python/tests/test_scenario.py checks them against docs/scenario_reference.md, which the registry
generates).

What the runner executes: one pipeline stage (pp = vpp = 1), no tensor or context parallelism
(tp = cp = 1), data parallelism over every rank, expert parallelism (ep dividing the world, etp = 1)
with the all-to-all dispatcher, MHA/GQA and MLA attention, RMSNorm or LayerNorm, SwiGLU or GeLU,
dense and MoE layers with shared experts, grouped / sequential / streams:N experts, bf16, training
steps (forward, backward, Adam) and inference steps (prefill, decode with a KV cache), no
recomputation, no CUDA graphs, no expert offloading.
"""
from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from threewalls.errors import InputError, UnsupportedError
from threewalls.profiler.records import fnv1a64_hex

_ANY = object()  # a key whose every valid value the runner executes

# table -> key -> (default, values the runner executes (_ANY = all), type)
_MODEL = {
    "name": ("", _ANY, str),
    "num_layers": (None, _ANY, int),
    "hidden_size": (None, _ANY, int),
    "ffn_hidden_size": (0, _ANY, int),
    "num_attention_heads": (None, _ANY, int),
    "num_query_groups": ("num_attention_heads", _ANY, int),
    "kv_channels": ("hidden_size / num_attention_heads", _ANY, int),
    "attention": ("mha", ("mha", "gqa", "mla"), str),
    "attention_impl": ("fused", ("fused",), str),
    "q_lora_rank": (0, _ANY, int),
    "kv_lora_rank": (0, _ANY, int),
    "qk_head_dim": (0, _ANY, int),
    "qk_pos_emb_head_dim": (0, _ANY, int),
    "v_head_dim": (0, _ANY, int),
    "vocab_size": (None, _ANY, int),
    "swiglu": (True, _ANY, bool),
    "untie_embeddings_and_output_weights": (True, _ANY, bool),
    "normalization": ("rmsnorm", ("rmsnorm", "layernorm"), str),
    "qk_layernorm": (False, (False,), bool),  # the runner has no query/key norms
    "position_embedding_type": ("none", ("none",), str),  # nor a rotary embedding
    "window_size": (0, (0,), int),  # nor sliding-window attention
    "window_attn_skip_freq": (0, (0,), int),
    "num_experts": (0, _ANY, int),
    "moe_ffn_hidden_size": (0, _ANY, int),
    "moe_router_topk": (0, _ANY, int),
    "moe_shared_expert_intermediate_size": (0, _ANY, int),
    "first_dense_layers": (0, _ANY, int),
    "moe_layer_freq": (1, _ANY, int),
    "moe_router_num_groups": (0, (0,), int),
    "moe_router_group_topk": (0, (0,), int),
    "mtp_num_layers": (0, (0,), int),
}
_PARALLEL = {
    "tp": (1, (1,), int),
    "cp": (1, (1,), int),
    "pp": (1, (1,), int),
    "vpp": (1, (1,), int),
    "dp": ("world / (tp x cp x pp)", _ANY, int),
    "ep": (1, _ANY, int),
    "etp": (1, (1,), int),
    "sequence_parallel": (False, (False,), bool),
    "layers_per_stage": ([], ([],), list),
    "first_stage_layers": (0, (0,), int),
    "last_stage_layers": (0, (0,), int),
}
_COMMON_STEP = {
    "precision": ("bf16", ("bf16",), str),
    # Read only with fp8 GEMMs, which the runner refuses: any value leaves a bf16 step unchanged.
    "fp8_recipe": ("delayed", _ANY, str),
    "fp8_format": ("hybrid", _ANY, str),
    "cuda_graph_scope": ([], ([],), list),
    "token_dispatcher": ("alltoall", ("alltoall",), str),
    "expert_execution": ("grouped", _ANY, str),
    "sync_routing_stats": (False, _ANY, bool),
    "sync_after_copy": (False, _ANY, bool),
}
_TRAIN = dict(_COMMON_STEP, **{
    "micro_batch_size": (None, _ANY, int),
    "global_batch_size": (None, _ANY, int),
    "seq_length": (None, _ANY, int),
    "recompute_granularity": ("none", ("none",), str),
    "recompute_method": ("uniform", _ANY, str),
    "recompute_num_layers": (1, _ANY, int),
    "recompute_modules": (["core_attn"], _ANY, list),
    "use_distributed_optimizer": (True, _ANY, bool),
    "overlap_grad_reduce": (False, (False,), bool),
    "overlap_param_gather": (False, (False,), bool),
    "tp_comm_overlap": (False, (False,), bool),
    "moe_shared_expert_overlap": (False, _ANY, bool),
    "overlap_moe_expert_parallel_comm": (False, (False,), bool),
    "delay_wgrad_compute": (False, (False,), bool),
    "data_parallel_sharding_strategy": ("none", ("none",), str),
    "grad_reduce_in_fp32": (True, (True,), bool),
    "fp8_param_gather": (False, (False,), bool),
    "first_last_layers_bf16": (False, (False,), bool),  # the runner trains in bf16 only
    "num_layers_at_start_in_bf16": (1, _ANY, int),
    "num_layers_at_end_in_bf16": (1, _ANY, int),
    "exp_avg_dtype": ("fp32", ("fp32",), str),
    "exp_avg_sq_dtype": ("fp32", ("fp32",), str),
    "routing_imbalance": (1.0, (1.0,), float),
    "grad_bucket_size": (40000000.0, _ANY, float),
})
_INFER = dict(_COMMON_STEP, **{
    "batch_size": (None, _ANY, int),
    "prompt_length": (None, _ANY, int),
    "generate_tokens": (None, _ANY, int),
    "kv_cache_precision": ("bf16", ("bf16",), str),
    "routing_skew": (0.0, _ANY, float),
    "routing_locality": (0.0, _ANY, float),
})
# The machine the scenario describes: the runner runs on the machine it is on, so these describe,
# they do not configure. gpus_per_node x nodes is the world size the run must have.
_CLUSTER = {
    "gpu": (None, ("h100", "h200"), str),
    "gpus_per_node": (None, _ANY, int),
    "nodes": (None, _ANY, int),
    "gpu_memory": ("by GPU kind", _ANY, str),
    "nvlink_bandwidth": ("by GPU kind", _ANY, str),
    "nvlink_latency": ("1us", _ANY, str),
    "pcie_bandwidth": ("64GBps", _ANY, str),
    "pcie_latency": ("1us", _ANY, str),
    "nic_bandwidth": ("400Gbps", _ANY, str),
    "nic_latency": ("2us", _ANY, str),
    "topology": ("rail_optimized", _ANY, str),
    "leaf_switch_ports": (64, _ANY, int),
    "oversubscription": (1.0, _ANY, float),
    "switch_latency": ("1us", _ANY, str),
}
_CALIBRATION = {"profile": ("auto", _ANY, str)}
_RUN = {"framework": ("cpp", ("cpp", "pytorch_eager"), str), "steps": (3, _ANY, int),
        "warmup_steps": (1, _ANY, int), "seed": (1234, _ANY, int),
        "cuda_device_max_connections": (8, tuple(range(1, 33)), int)}
_PROFILER = {
    "enabled": (True, _ANY, bool),
    "start_step": (0, _ANY, int),
    "end_step": (-1, _ANY, int),
    "record_every_n_steps": (10, _ANY, int),
    "flush_every_n_steps": (10, _ANY, int),
    "ranks": ("auto", _ANY, object),
    "granularity": ("layer", ("layer", "coarse"), str),
}
TABLES: Dict[str, Dict[str, tuple]] = {
    "": {"schema_version": (None, (1,), int), "name": ("the file name without .toml", _ANY, str),
         "description": ("", _ANY, str)},
    "model": _MODEL, "parallel": _PARALLEL, "train": _TRAIN, "infer": _INFER, "cluster": _CLUSTER,
    "calibration": _CALIBRATION, "run": _RUN, "run.profiler": _PROFILER,
}
# Tables of the language that the runner does not execute at all.
REFUSED_TABLES = {
    "cluster.slowdown": "a slow GPU or link is a what-if of the simulator; a real run cannot slow its GPUs",
    "infer.expert_offload": "expert offloading (the C++ backend runs it: threewalls run)",
}
# Why a value of a supported key is refused (key -> reason).
_REASONS = {
    "run.cuda_device_max_connections": "a CUDA_DEVICE_MAX_CONNECTIONS outside CUDA's range",
    "parallel.tp": "tensor parallelism", "parallel.cp": "context parallelism",
    "parallel.pp": "pipeline parallelism", "parallel.vpp": "interleaved pipeline stages",
    "parallel.etp": "expert tensor parallelism", "parallel.sequence_parallel": "sequence parallelism",
    "parallel.layers_per_stage": "pipeline stages", "parallel.first_stage_layers": "pipeline stages",
    "parallel.last_stage_layers": "pipeline stages", "precision": "fp8 GEMMs",
    "cuda_graph_scope": "CUDA graphs", "token_dispatcher": "the allgather and flex dispatchers",
    "train.recompute_granularity": "activation recomputation",
    "train.overlap_grad_reduce": "overlapped gradient reduction",
    "train.overlap_param_gather": "overlapped parameter gathering",
    "train.tp_comm_overlap": "tensor-parallel communication overlap",
    "model.moe_router_num_groups": "group-limited routing", "model.moe_router_group_topk": "group-limited routing",
    "model.mtp_num_layers": "multi-token prediction depths",
    "train.routing_imbalance": "imbalanced routing (the runner routes every EP rank the balanced share)",
    "infer.kv_cache_precision": "an fp8 KV cache", "cluster.gpu": "other GPU kinds",
    "model.attention_impl": "unfused attention (the runner runs scaled_dot_product_attention)",
}


@dataclass
class Scenario:
    path: str
    name: str
    hash: str
    model: Dict[str, Any]
    parallel: Dict[str, Any]
    step: Dict[str, Any]          # [train] or [infer]
    training: bool
    cluster: Dict[str, Any]
    run: Dict[str, Any]
    profiler: Dict[str, Any]
    calibration: Dict[str, Any]
    world_size: int
    expert_kind: str = "grouped"  # "grouped", "sequential" or "streams"
    expert_streams: int = 1
    derived: Dict[str, Any] = field(default_factory=dict)

    # ---- derived sizes ----
    @property
    def moe(self) -> bool:
        return self.model["num_experts"] > 0

    def layer_is_moe(self, layer: int) -> bool:
        m = self.model
        if m["num_experts"] == 0 or layer < m["first_dense_layers"]:
            return False
        return (layer - m["first_dense_layers"]) % m["moe_layer_freq"] == 0

    @property
    def padded_vocab(self) -> int:
        mult = 128 * self.parallel["tp"]
        return (self.model["vocab_size"] + mult - 1) // mult * mult

    @property
    def dp(self) -> int:
        return self.parallel["dp"]

    @property
    def ep(self) -> int:
        return self.parallel["ep"]

    @property
    def num_microbatches(self) -> int:
        t = self.step
        return t["global_batch_size"] // (t["micro_batch_size"] * self.dp)

    def infer_step_kind(self, step: int) -> Tuple[str, int]:
        """("prefill", 0) or ("decode", position) of inference step `step` (docs/stepgraph.md)."""
        period = 1 + self.step["generate_tokens"]
        pos = step % period
        return ("prefill", 0) if pos == 0 else ("decode", pos)


def _where(path: str, table: str, key: str) -> str:
    return f"{path}: [{table}] {key}" if table else f"{path}: {key}"


def _typed(path: str, table: str, key: str, value: Any, typ: type) -> Any:
    w = _where(path, table, key)
    if typ is object:
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{w} = {value!r}: expected a number")
        return float(value)
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise InputError(f"{w} = {value!r}: expected an integer")
    if typ is not int and not isinstance(value, typ):
        raise InputError(f"{w} = {value!r}: expected a {typ.__name__}")
    return value


def _read_table(path: str, table: str, data: Dict[str, Any], spec: Dict[str, tuple]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
            continue  # sub-tables are read on their own
        if key not in spec:
            raise UnsupportedError(
                f"{_where(path, table, key)}: not a key the PyTorch runner reads (a key threewalls does not know, "
                f"or a feature the runner does not execute); keys of [{table or 'top level'}] it reads: "
                f"{', '.join(spec)}")
        default, allowed, typ = spec[key]
        v = _typed(path, table, key, value, typ)
        if allowed is not _ANY and v not in allowed:
            reason = _REASONS.get(f"{table}.{key}") or _REASONS.get(key) or "this value"
            shown = ", ".join(repr(a) if not isinstance(a, str) else f'"{a}"' for a in allowed)
            raise UnsupportedError(f"{_where(path, table, key)} = {value!r}: the PyTorch runner does not execute "
                                   f"{reason}; it runs: {shown}")
        out[key] = v
    for key, (default, _allowed, _typ) in spec.items():
        if key in out:
            continue
        if default is None:
            raise InputError(f"{_where(path, table, key)}: missing (required)")
        out[key] = default
    return out


def scenario_name(path: str, name_key: Any) -> str:
    """A scenario's name: its top-level `name`, else the file name without .toml (the registry's default)."""
    if isinstance(name_key, str) and name_key and name_key != "the file name without .toml":
        return name_key
    return os.path.splitext(os.path.basename(path))[0]


def identity(path: str) -> Dict[str, Any]:
    """What a run header says of scenario `path` without executing it: name, path, hash (FNV-1a 64 of
    the file) and world size (cluster.gpus_per_node x nodes, None when the file has no [cluster]).
    For importers of runs made elsewhere, which need the scenario only to line the run up with
    `threewalls sim` of it."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        doc = tomllib.loads(raw.decode("utf-8"))
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid TOML: {e}") from e
    cluster = doc.get("cluster", {})
    world = None
    if isinstance(cluster, dict) and isinstance(cluster.get("gpus_per_node"), int):
        world = cluster["gpus_per_node"] * int(cluster.get("nodes", 1))
    return {"name": scenario_name(path, doc.get("name")), "path": path, "hash": fnv1a64_hex(raw), "world_size": world}


def load(path: str, model_from_transformers: bool = False) -> Scenario:
    """Reads and checks scenario `path`. Raises InputError (bad file) or UnsupportedError (a valid
    feature the runner does not execute), each naming the file and the key. With
    model_from_transformers (the runner's --hf-config: transformers runs the model), every value of a
    [model] key is accepted: the runner does not execute the model's layers itself."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from e
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid TOML: {e}") from e

    def sub(d: Dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            name = f"{prefix}.{k}" if prefix else k
            is_table = isinstance(v, dict) or (isinstance(v, list) and v and isinstance(v[0], dict))
            if not is_table:
                continue
            if name in REFUSED_TABLES:
                raise UnsupportedError(f"{path}: [{name}]: the PyTorch runner does not execute "
                                       f"{REFUSED_TABLES[name]}")
            if name not in TABLES:
                raise UnsupportedError(f"{path}: [{name}]: not a table the PyTorch runner reads; tables: "
                                       f"{', '.join(t for t in TABLES if t)}")
            if isinstance(v, dict):
                sub(v, name)

    sub(doc, "")
    top = _read_table(path, "", doc, TABLES[""])
    for req in ("model", "cluster"):
        if req not in doc:
            raise InputError(f"{path}: [{req}]: missing (required)")
    if ("train" in doc) == ("infer" in doc):
        raise InputError(f"{path}: exactly one of [train] and [infer] is required")
    training = "train" in doc
    model = _read_table(path, "model", doc["model"],
                        {k: (d, _ANY, t) for k, (d, _, t) in _MODEL.items()} if model_from_transformers else _MODEL)
    parallel = _read_table(path, "parallel", doc.get("parallel", {}), _PARALLEL)
    step_tab = "train" if training else "infer"
    step = _read_table(path, step_tab, doc[step_tab], _TRAIN if training else _INFER)
    cluster = _read_table(path, "cluster", doc["cluster"], _CLUSTER)
    calibration = _read_table(path, "calibration", doc.get("calibration", {}), _CALIBRATION)
    run = _read_table(path, "run", doc.get("run", {}), _RUN)
    profiler = _read_table(path, "run.profiler", doc.get("run", {}).get("profiler", {}), _PROFILER)

    # Defaults that depend on other keys (as the registry defines them).
    if model["num_query_groups"] == "num_attention_heads":
        model["num_query_groups"] = model["num_attention_heads"]
    if model["kv_channels"] == "hidden_size / num_attention_heads":
        model["kv_channels"] = model["hidden_size"] // model["num_attention_heads"]
    world = cluster["gpus_per_node"] * cluster["nodes"]
    if parallel["dp"] == "world / (tp x cp x pp)":
        parallel["dp"] = world
    elif parallel["dp"] != world:
        raise InputError(f"{path}: [parallel] dp = {parallel['dp']}: must equal world / (tp x cp x pp) = {world}")
    if world % parallel["ep"] != 0:
        raise InputError(f"{path}: [parallel] ep = {parallel['ep']}: must divide the world size {world}")

    name = scenario_name(path, top["name"])
    s = Scenario(path=path, name=name, hash=fnv1a64_hex(raw), model=model, parallel=parallel, step=step,
                 training=training, cluster=cluster, run=run, profiler=profiler, calibration=calibration,
                 world_size=world)
    _check(s)
    return s


def _check(s: Scenario) -> None:
    p = s.path
    m = s.model
    ex = s.step["expert_execution"]
    if ex == "grouped" or ex == "sequential":
        s.expert_kind = ex
    elif ex.startswith("streams:") and ex[8:].isdigit() and int(ex[8:]) >= 1:
        s.expert_kind = "streams"
        s.expert_streams = int(ex[8:])
    else:
        raise InputError(f"{_where(p, 'train' if s.training else 'infer', 'expert_execution')} = \"{ex}\"; allowed: "
                         "\"sequential\", \"streams:N\" (N >= 1), \"grouped\"")
    if m["attention"] == "mla":
        for k in ("kv_lora_rank", "qk_head_dim", "v_head_dim"):
            if m[k] <= 0:
                raise InputError(f"{_where(p, 'model', k)}: required (> 0) with attention = \"mla\"")
    elif m["num_attention_heads"] % m["num_query_groups"] != 0:
        raise InputError(f"{_where(p, 'model', 'num_query_groups')} = {m['num_query_groups']}: must divide "
                         f"num_attention_heads = {m['num_attention_heads']}")
    if s.moe:
        for k in ("moe_ffn_hidden_size", "moe_router_topk"):
            if m[k] <= 0:
                raise InputError(f"{_where(p, 'model', k)}: required (> 0) when num_experts > 0")
        if m["moe_router_topk"] > m["num_experts"]:
            raise InputError(f"{_where(p, 'model', 'moe_router_topk')} = {m['moe_router_topk']}: more than "
                             f"num_experts = {m['num_experts']}")
        if m["num_experts"] % s.ep != 0:
            raise InputError(f"{_where(p, 'parallel', 'ep')} = {s.ep}: must divide num_experts = {m['num_experts']}")
    if any(not s.layer_is_moe(l) for l in range(m["num_layers"])) and m["ffn_hidden_size"] <= 0:
        raise InputError(f"{_where(p, 'model', 'ffn_hidden_size')}: required (> 0): the model has dense layers")
    if s.training:
        t = s.step
        if t["global_batch_size"] % (t["micro_batch_size"] * s.dp) != 0:
            raise InputError(f"{_where(p, 'train', 'global_batch_size')} = {t['global_batch_size']}: must be a "
                             f"multiple of micro_batch_size x dp = {t['micro_batch_size'] * s.dp}")
        if s.ep > 1 and (t["micro_batch_size"] * t["seq_length"] * m.get("moe_router_topk", 1)) % s.ep != 0:
            raise InputError(f"{_where(p, 'train', 'seq_length')}: micro_batch_size x seq_length x topk must be a "
                             f"multiple of ep = {s.ep}")
    else:
        if s.ep > 1:
            raise UnsupportedError(f"{_where(p, 'parallel', 'ep')} = {s.ep}: the PyTorch runner runs inference "
                                   "on one rank per data-parallel replica (ep = 1)")
        for k in ("routing_skew", "routing_locality"):
            if s.step[k] != 0.0:
                raise UnsupportedError(
                    f"{_where(p, 'infer', k)} = {s.step[k]}: the PyTorch runner routes with its router's own "
                    "top-k (random weights), not the simulator's seeded routing model; set it to 0")
    run = s.run
    if run["steps"] < 1 or run["warmup_steps"] < 0:
        raise InputError(f"{_where(p, 'run', 'steps')}: steps >= 1 and warmup_steps >= 0 required")


def calibration_peak_flops(s: Scenario) -> Optional[float]:
    """The dense bf16 peak of the scenario's GPU from its calibration profile ([hardware]
    peak_bf16_flop_per_s), for summary.json's MFU: `profile` relative to the scenario file, or for
    "auto" the shipped calibration/profiles/<gpu>.toml of the checkout the scenario lives in. None
    when the file is not there (a scenario outside a checkout)."""
    prof = s.calibration["profile"]
    candidates: List[str] = []
    if prof != "auto":
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(s.path)), prof))
    else:
        d = os.path.dirname(os.path.abspath(s.path))
        while True:
            candidates.append(os.path.join(d, "calibration", "profiles", f"{s.cluster['gpu']}.toml"))
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
    for c in candidates:
        if os.path.isfile(c):
            with open(c, "rb") as f:
                doc = tomllib.load(f)
            v = doc.get("hardware", {}).get("peak_bf16_flop_per_s")
            if isinstance(v, (int, float)) and v > 0 and math.isfinite(v):
                return float(v)
    return None
