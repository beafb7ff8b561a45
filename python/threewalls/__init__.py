"""threewalls for PyTorch programs.

* threewalls.profiler: a sampled profiler for PyTorch training and inference loops (phases as context
  managers and module hooks, CUDA events on the streams in use, NVTX ranges) writing the run-directory
  format that `threewalls compare`, `analyze` and `export` read (docs/formats/run_dir.md).
* threewalls.runner: a reference PyTorch runner that executes a scenario's model for real and
  writes a run directory lined up with `threewalls sim` of the same scenario.

See docs/python.md.
"""
__version__ = "0.1.0"
