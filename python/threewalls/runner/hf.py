"""A Hugging Face transformers model as the runner's second source of real steps.

    threewalls import hf CONFIG.json > model.toml      # the [model] of the scenario (then add [train], ...)
    python3 -m threewalls.runner SCENARIO.toml --hf-config CONFIG.json --out RUN_DIR
    threewalls sim SCENARIO.toml --out SIM_DIR && threewalls compare RUN_DIR SIM_DIR

The model is transformers' own class for the config's `model_type` (AutoModelForCausalLM.from_config,
random weights, the scenario's number of layers), with the implementation transformers chooses for
its attention and experts, in the mixed precision of transformers' Trainer with `bf16=True` (fp32
parameters, gradients and AdamW state, the forward under bf16 autocast; `--hf-params bf16`: bf16
parameters, gradients and AdamW state instead): what a Hugging Face user runs, not the reference runner's ops (whose parameter state is Megatron's). The
scenario gives the rest: micro-batch size, sequence length, micro-batches per step (one GPU: global
batch / micro-batch), steps, warm-up steps and the profiler's sampling. A training step is, per
micro-batch, the input copy (`host_to_device`), the model's forward with labels (its loss included)
and the backward; then AdamW (fp32 moments on the bf16 weights, torch.optim's foreach path) and the
host's read of the loss. The profiler times, on recorded steps, every decoder layer's attention and
MLP / MoE block (`<module>_fwd`, `<module>_bwd` from module hooks, with the layer and micro-batch),
the embedding and the output head, the optimizer step and the loss read; the names of the blocks
are transformers' module names, so `compare` lines up the step, the memory and the phases both sides
name alike (`host_to_device`, `optimizer_step`, `training_metrics_read`), and lists the rest as one
side's only.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import torch

from threewalls.errors import InputError

# --hf-params: the parameters' type. fp32 is transformers' Trainer with bf16=True (fp32 parameters, the
# forward under bf16 autocast); bf16 is a model loaded in bf16 and trained so (bf16 parameters,
# gradients and AdamW moments), as users do with `torch_dtype=torch.bfloat16`.
PARAMETER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Fields whose values must agree between the HF config and the scenario's [model] (same names in both).
_SAME_NAMES = ("hidden_size", "num_attention_heads", "vocab_size")


def _load_config(path: str, num_layers: int):
    try:
        import transformers
    except ImportError as e:
        raise InputError(f"--hf-config needs the transformers package ({e})") from None
    if not os.path.isfile(path):
        raise InputError(f"--hf-config {path}: no such file (an HF config.json)")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"--hf-config {path}: not a JSON file ({e})") from None
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        raise InputError(f"{path}: key 'model_type' missing; transformers needs it to choose the model class")
    raw = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "architectures",
                                                      "auto_map", "quantization_config", "torch_dtype")}
    raw["num_hidden_layers"] = num_layers
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **raw)
    except (ValueError, KeyError) as e:
        raise InputError(f"{path}: model_type {model_type!r}: transformers {transformers.__version__} cannot "
                         f"build its config ({e})") from None
    return transformers, cfg


def check_against_scenario(cfg: Any, model: Dict[str, Any], path: str, scenario_path: str) -> None:
    """The HF config and the scenario describe the same model: an error names the field and both values."""
    for key in _SAME_NAMES:
        a, b = getattr(cfg, key, None), model.get(key)
        if a is not None and b is not None and int(a) != int(b):
            raise InputError(f"{path}: {key} = {a}, but {scenario_path}: [model] {key} = {b}; run the scenario "
                             f"that `threewalls import hf {os.path.basename(path)}` gives")


def _blocks(hf_model) -> List[Any]:
    """The decoder layers of a causal-LM model (model.model.layers in every transformers decoder)."""
    inner = getattr(hf_model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise InputError(f"{type(hf_model).__name__}: no model.layers (not a transformers decoder-only model)")
    return list(layers)


def _mlp(layer):
    return getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)


def _hook(prof, hf_model, moe: bool, mb) -> List[Any]:
    """Module hooks: each layer's attention and MLP / MoE block, the embedding and the output head,
    with the micro-batch `mb()`."""
    handles: List[Any] = []
    for i, layer in enumerate(_blocks(hf_model)):
        attn = getattr(layer, "self_attn", None)
        mlp = _mlp(layer)
        if attn is not None:
            handles += prof.hook_module(attn, "self_attn", layer=i, microbatch=mb)
        if mlp is not None:
            handles += prof.hook_module(mlp, "moe" if moe else "mlp", layer=i, microbatch=mb)
    emb = hf_model.get_input_embeddings()
    if emb is not None:
        handles += prof.hook_module(emb, "embed_tokens", backward=False, microbatch=mb)
    head = hf_model.get_output_embeddings()
    if head is not None:
        handles += prof.hook_module(head, "lm_head", microbatch=mb)
    return handles


def build(args, s, device, dtype):
    """transformers' model for --hf-config with the scenario's layers, random fp32 weights, on `device`
    (`dtype` is the autocast type of the forward); returns it and the runner settings for the run
    header."""
    if not s.training:
        raise InputError(f"{args.scenario}: --hf-config runs training steps; this scenario is [infer]")
    if s.world_size != 1:
        raise InputError(f"{args.scenario}: --hf-config runs one GPU; the scenario's world is {s.world_size}")
    transformers, cfg = _load_config(args.hf_config, s.model["num_layers"])
    check_against_scenario(cfg, s.model, args.hf_config, args.scenario)
    params = PARAMETER_DTYPES[getattr(args, "hf_params", None) or "fp32"]
    torch.manual_seed(s.run["seed"])
    with torch.device(device):
        try:
            hf_model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=params)
        except TypeError:  # transformers before "dtype" replaced "torch_dtype"
            hf_model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=params)
    hf_model.to(device=device, dtype=params)
    hf_model.train()
    mlp = _mlp(_blocks(hf_model)[0])
    experts = getattr(mlp, "experts", None)
    settings = {"model": "transformers", "class": type(hf_model).__name__, "model_type": cfg.model_type,
                "mlp_module": type(mlp).__name__ if mlp is not None else None,
                "experts_module": type(experts).__name__ if experts is not None else None,
                "experts_implementation": getattr(cfg, "_experts_implementation", None),
                "config": args.hf_config, "transformers": transformers.__version__,
                "attn_implementation": getattr(cfg, "_attn_implementation", None),
                "precision": (("fp32 parameters, gradients and AdamW state; forward under "
                               + ("bf16 autocast" if dtype == torch.bfloat16 else "fp32"))
                              if params == torch.float32 else
                              "bf16 parameters, gradients and AdamW state (no fp32 copy)"),
                "parameters": sum(p.numel() for p in hf_model.parameters())}
    return hf_model, settings


def train(s, hf_model, prof, device, dtype, gen, steps: int, warmup: int, walls) -> None:
    """Warm-up and measured training steps of the HF model (the module's doc)."""
    opt = torch.optim.AdamW(hf_model.parameters(), lr=1e-5, foreach=device.type == "cuda")
    cur = {"mb": 0}
    handles = _hook(prof, hf_model, s.moe, lambda: cur["mb"])
    mbs, seq = s.step["micro_batch_size"], s.step["seq_length"]
    m = s.num_microbatches
    vocab = int(hf_model.config.vocab_size)
    pin = device.type == "cuda"
    try:
        for i in range(warmup + steps):
            measured = i >= warmup
            step = i - warmup
            batches = []
            for _ in range(m):
                ids = torch.randint(0, vocab, (mbs, seq), generator=gen)
                batches.append(ids.pin_memory() if pin else ids)
            if measured:
                prof.begin_step(step)
            loss_sum = None
            for mb, ids_h in enumerate(batches):
                cur["mb"] = mb
                with prof.phase("host_to_device", wall="memory", bytes=float(ids_h.numel() * 8), microbatch=mb,
                                coarse="host_to_device"):
                    ids = ids_h.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                    loss = hf_model(input_ids=ids, labels=ids).loss / m
                loss.backward()
                loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            with prof.phase("optimizer_step", wall="memory"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            with prof.host_phase("training_metrics_read", coarse="training_metrics", waits_for_device=True):
                float(loss_sum.item())
            if measured:
                recorded = prof.recording
                prof.end_step()
                walls.end(step, recorded)
            else:
                walls.end(None, False)
    finally:
        for h in handles:
            h.remove()
