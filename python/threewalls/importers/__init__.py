"""Importers of real runs (docs/python.md, "Importing real runs"): a PyTorch profiler (Kineto) trace or
the timers of a Megatron-LM training log become a run directory (docs/formats/run_dir.md), written
through the package's RunDirWriter, so `threewalls compare`, `analyze` and `export` read them.

    python3 -m threewalls.importers kineto TRACE.json [TRACE_rank1.json ...] --out RUN_DIR
    python3 -m threewalls.importers megatron-log TRAIN.log --out RUN_DIR
"""
