"""Shared helpers of the Python package's tests (run by CTest: python/CMakeLists.txt).

THREEWALLS_BIN names the `threewalls` binary (CTest sets it); tests that need it fail when it is
missing under CTest (THREEWALLS_REQUIRE_BIN=1) and are skipped, with the reason, elsewhere.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import unittest
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)                 # python/
REPO = os.path.dirname(PYROOT)                 # the checkout
SCENARIOS = os.path.join(HERE, "scenarios")
if PYROOT not in sys.path:
    sys.path.insert(0, PYROOT)


def threewalls_bin() -> Optional[str]:
    b = os.environ.get("THREEWALLS_BIN")
    if b and os.path.isfile(b):
        return b
    return None


def need_bin(test: unittest.TestCase) -> str:
    b = threewalls_bin()
    if b is None:
        if os.environ.get("THREEWALLS_REQUIRE_BIN") == "1":
            test.fail("THREEWALLS_BIN does not name the threewalls binary (build the 'threewalls' target)")
        raise unittest.SkipTest("needs the threewalls binary: set THREEWALLS_BIN (CTest does)")
    return b


def cli(test: unittest.TestCase, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    b = need_bin(test)
    r = subprocess.run([b, *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        test.fail(f"threewalls {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def env_with_package() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def tempdir(test: unittest.TestCase) -> str:
    d = tempfile.mkdtemp(prefix="tw_py_")
    test.addCleanup(_rmtree, d)
    return d


def _rmtree(d: str) -> None:
    import shutil
    shutil.rmtree(d, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_runner(test: unittest.TestCase, scenario: str, out: str, world: int = 1, extra: Sequence[str] = (),
               timeout: float = 240) -> None:
    """Runs `python3 -m threewalls.runner` on `world` processes (gloo on CPU), failing the test with
    their output when one exits non-zero."""
    env = env_with_package()
    procs = []
    port = free_port()
    for r in range(world):
        e = dict(env)
        if world > 1:
            e.update({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": str(port)})
        procs.append(subprocess.Popen([sys.executable, "-m", "threewalls.runner", scenario, "--out", out,
                                       "--device", "cpu", *extra], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            test.fail(f"runner on {scenario} timed out")
        outs.append((p.returncode, o))
    for rc, o in outs:
        if rc != 0:
            test.fail(f"runner on {scenario} exited {rc}:\n" + "\n".join(x for _, x in outs))


def variant(base: str, edits: Sequence[Tuple[str, Dict[str, object]]], name: str, dest: str) -> str:
    """A copy of scenario `base` with keys set (value) or removed (value None) per table ("" = top
    level), written to dest/name.toml; returns its path."""
    with open(base, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for table, keys in edits:
        out: List[str] = []
        cur = ""
        seen = False
        for line in lines:
            m = re.match(r"^\[(.*)\]\s*$", line)
            if m:
                if cur == table and not seen:
                    out.extend(_kv(keys))
                    seen = True
                cur = m.group(1)
                out.append(line)
                if cur == table:
                    out.extend(_kv(keys))
                    seen = True
                continue
            km = re.match(r"^([A-Za-z_]+)\s*=", line)
            if cur == table and km and km.group(1) in keys:
                continue
            out.append(line)
        if not seen:
            out.append(f"[{table}]")
            out.extend(_kv(keys))
        lines = out
    text = "\n".join(lines) + "\n"
    text = re.sub(r'^name = "[^"]*"', f'name = "{name}"', text, count=1, flags=re.M)
    path = os.path.join(dest, name + ".toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _kv(keys: Dict[str, object]) -> List[str]:
    out = []
    for k, v in keys.items():
        if v is None:
            continue
        out.append(f"{k} = {json.dumps(v)}")
    return out


def keys_of(run_dir: str, with_step: bool = True) -> set:
    """The record keys (step, rank, phase, layer, microbatch, expert) of a run directory."""
    from threewalls.profiler.summary import read_records
    recs = read_records(run_dir)
    return {((p["step"],) if with_step else ()) + (p["rank"], p["phase"], p["layer"], p["microbatch"],
                                                   p.get("expert")) for p in recs["phases"]}


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


SKIP_NO_CUDA = "CUDA path: needs a GPU (the CI image has CPU-only PyTorch; scripts/python_gpu_checks.sh runs it)"
