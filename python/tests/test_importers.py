"""Importers of real runs (threewalls.importers): PyTorch profiler traces and Megatron-LM logs become
run directories that `threewalls compare` reads beside a simulation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

from support import HERE, PYROOT, SCENARIOS, cli, env_with_package, run_runner, tempdir  # noqa: F401

from threewalls.errors import InputError
from threewalls.importers import kineto, megatron_log
from threewalls.importers.output import scenario_of
from threewalls.profiler import records as rec
from threewalls.profiler.summary import read_records

SAMPLES = os.path.join(HERE, "samples")
TINY = os.path.join(SCENARIOS, "tiny_moe.toml")


def importer(test, *args, check=True):
    r = subprocess.run([sys.executable, "-m", "threewalls.importers", *args], env=env_with_package(),
                       capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        test.fail(f"importer {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def keyed(run_dir):
    recs = read_records(run_dir)
    return {(p["step"], p["rank"], p["phase"], p["layer"], p["microbatch"], p.get("expert")): p
            for p in recs["phases"]}, recs


def compare_json(test, a, b):
    d = tempdir(test)
    out = os.path.join(d, "cmp.json")
    cli(test, "compare", a, b, "--json", out)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


class AnnotationNames(unittest.TestCase):
    def test_round_trip_with_separators_and_quotes(self):
        fields = {"layer": 3, "microbatch": None, "wall": "communication", "bytes": 1.5e9, "flops": 0.0,
                  "expert": 7, "group": "e;p=\"x\"", "group_id": 4, "tokens": 12, "coarse": None}
        name = rec.annotation_name('moe;dispatch="fwd"', fields)
        self.assertNotIn('"', name)
        self.assertEqual(rec.parse_annotation(name),
                         {"phase": 'moe;dispatch="fwd"', "layer": 3, "microbatch": None, "wall": "communication",
                          "bytes": 1.5e9, "flops": 0.0, "expert": 7, "group": 'e;p="x"', "group_id": 4, "tokens": 12})
        self.assertEqual(rec.parse_annotation(rec.step_annotation_name(12)), {"step": 12})
        self.assertIsNone(rec.parse_annotation("aten::mm"))
        for bad in ("threewalls:step=x", "threewalls:attn;layer", "threewalls:attn;layer=1", "threewalls:a;wall=host;layer=z"):
            with self.assertRaises(ValueError, msg=bad):
                rec.parse_annotation(bad)


class KinetoFromTheRunner(unittest.TestCase):
    """The runner's own records and the import of its torch.profiler trace are the same records."""

    def test_cpu_trace_of_the_runner_imports_to_its_records(self):
        d = tempdir(self)
        run, trace, imp = (os.path.join(d, x) for x in ("run", "trace.json", "imported"))
        run_runner(self, TINY, run, extra=["--steps", "2", "--warmup-steps", "1", "--record-every", "1",
                                           "--torch-profile", trace])
        r = importer(self, "kineto", trace, "--out", imp, "--scenario", TINY)
        self.assertIn("2 step(s)", r.stdout)
        mine, _ = keyed(run)
        theirs, recs = keyed(imp)
        self.assertEqual(set(mine), set(theirs))
        for k, p in theirs.items():
            q = mine[k]
            for f in ("wall", "bytes", "flops", "stream", "group", "tokens", "coarse"):
                self.assertEqual(p.get(f), q.get(f), (k, f))
            # The range holds the profiler's own host timing of the phase (trace times are whole us).
            self.assertGreaterEqual(p["dur_us"], q["dur_us"] - 1.0, k)
        total_mine = sum(q["dur_us"] for q in mine.values())
        self.assertLess(sum(p["dur_us"] for p in theirs.values()), 1.5 * total_mine)
        c = compare_json(self, run, imp)
        self.assertEqual(c["matched_records"], len(mine))
        import gzip  # a compressed trace reads the same
        with open(trace, "rb") as f, gzip.open(trace + ".gz", "wb") as g:
            g.write(f.read())
        importer(self, "kineto", trace + ".gz", "--out", imp + "_gz", "--scenario", TINY)
        self.assertEqual(keyed(imp + "_gz")[0].keys(), theirs.keys())
        self.assertEqual((len(c["only_in_a"]), len(c["only_in_b"])), (0, 0))
        self.assertFalse(c["megatron_timers"])
        self.assertEqual(c["different_scenarios"], [])

    def test_stored_cpu_sample_against_a_simulation(self):
        d = tempdir(self)
        imp, sim = os.path.join(d, "imported"), os.path.join(d, "sim")
        importer(self, "kineto", os.path.join(SAMPLES, "kineto_tiny_moe_cpu.json"), "--out", imp, "--scenario", TINY)
        recs, raw = keyed(imp)
        self.assertEqual([s["step"] for s in raw["steps"]], [0])
        self.assertEqual(len(recs), 153)
        h2d = recs[(0, 0, "host_to_device", None, 0, None)]
        self.assertEqual((h2d["wall"], h2d["bytes"], h2d["coarse"], h2d["stream"]),
                         ("memory", 1024, "host_to_device", "compute"))
        fc1 = recs[(0, 0, "expert_fc1_fwd", 1, 0, None)]
        self.assertEqual((fc1["wall"], fc1["flops"], fc1["tokens"]), ("compute", 524288, 64))
        with open(os.path.join(imp, "run.json"), encoding="utf-8") as f:
            run = json.load(f)
        self.assertEqual((run["source"], run["scenario"]["name"], run["settings"]["import"]["format"]),
                         ("real", "tiny_moe", "kineto"))
        cli(self, "sim", TINY, "--out", sim)
        c = compare_json(self, imp, sim)
        self.assertEqual(c["different_scenarios"], [])
        self.assertEqual(c["matched_steps"], [0])
        self.assertGreater(c["matched_records"], 100)


def _gpu_trace(rank=1, world=2):
    """A Kineto trace in the form PyTorch 2.x writes on a GPU (traceEvents, cats, correlation ids):
    two steps; step 0 has a phase whose kernels run on two streams, a nested generic range, an NCCL
    phase and a host phase; one kernel is launched outside every range."""
    ev = []
    corr = [0]

    def cpu(name, ts, dur, tid=10, cat="user_annotation"):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur})

    def launch(ts, k_ts, k_dur, stream, name="sm90_gemm", tid=10, cat="kernel"):
        corr[0] += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": tid, "ts": ts,
                   "dur": 3, "args": {"correlation": corr[0]}})
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": k_ts, "dur": k_dur,
                   "args": {"correlation": corr[0], "stream": stream, "device": 0}})

    qkv = rec.annotation_name("attn_qkv_fwd", {"layer": 0, "microbatch": 0, "wall": "compute", "bytes": 100,
                                               "flops": 2000})
    a2a = rec.annotation_name("moe_dispatch_fwd", {"layer": 0, "microbatch": 0, "wall": "communication",
                                                   "bytes": 64, "flops": 0, "group": "ep", "group_id": 0})
    read = rec.annotation_name("training_metrics_read", {"layer": None, "microbatch": None, "wall": "host",
                                                        "bytes": 0, "flops": 0, "coarse": "training_metrics"})
    cpu(rec.step_annotation_name(0), 1000, 500)
    cpu(qkv, 1010, 40)
    cpu("inner_range", 1020, 10)       # not a threewalls range: its launch still belongs to qkv
    launch(1012, 1100, 30, 7)
    launch(1022, 1140, 20, 13)
    cpu(a2a, 1060, 20)
    launch(1065, 1170, 50, 7, name="ncclDevKernel_AllToAll")
    launch(1090, 1230, 10, 7, name="Memcpy DtoH", cat="gpu_memcpy")  # launched outside every phase
    cpu(read, 1300, 15)
    cpu(rec.step_annotation_name(1), 2000, 300)
    cpu(qkv, 2010, 40)
    launch(2012, 2050, 25, 7)
    ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": qkv, "pid": 0, "tid": 7, "ts": 2050, "dur": 25})
    ev.append({"ph": "i", "cat": "cpu_instant_event", "name": "x", "pid": 100, "tid": 10, "ts": 1})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}, "traceEvents": ev}


class KinetoGpuForm(unittest.TestCase):
    def write(self, obj, name="t.json"):
        d = tempdir(self)
        p = os.path.join(d, name)
        with open(p, "w", encoding="utf-8") as f:
            json.dump(obj, f)
        return p, d

    def test_device_times_from_correlated_launches(self):
        p, d = self.write(_gpu_trace())
        out = os.path.join(d, "imp")
        run = kineto.import_traces([p], scenario=scenario_of(None, "synthetic"))
        run.write(out, overwrite=False, argv=["test"])
        recs, raw = keyed(out)
        steps = {(s["step"], s["rank"]): s for s in raw["steps"]}
        self.assertEqual(set(steps), {(0, 1), (1, 1)})
        # Step 0 starts at its first kernel (1100) and ends with the host read (1315); epochs count
        # from the trace's first complete event (the step range, ts 1000).
        self.assertEqual((steps[(0, 1)]["epoch_us"], steps[(0, 1)]["dur_us"]), (100, 215))
        qkv = recs[(0, 1, "attn_qkv_fwd", 0, 0, None)]
        self.assertEqual((qkv["start_us"], qkv["dur_us"], qkv["stream"], qkv["flops"]), (0, 60, "cuda_stream_7", 2000))
        a2a = recs[(0, 1, "moe_dispatch_fwd", 0, 0, None)]
        self.assertEqual((a2a["start_us"], a2a["dur_us"], a2a["wall"], a2a["group"], a2a["group_id"]),
                         (70, 50, "communication", "ep", 0))
        host = recs[(0, 1, "training_metrics_read", None, None, None)]
        self.assertEqual((host["start_us"], host["dur_us"], host["stream"], host["coarse"]),
                         (200, 15, "host", "training_metrics"))
        self.assertEqual((steps[(1, 1)]["dur_us"], recs[(1, 1, "attn_qkv_fwd", 0, 0, None)]["dur_us"]), (25, 25))
        with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
            j = json.load(f)
        self.assertEqual((j["world_size"], j["ranks"], j["device"]), (2, [1], "NVIDIA H100 80GB HBM3"))
        self.assertEqual(j["settings"]["import"]["unattributed_device_us"], {"1": 10.0})

    def test_generic_trace_takes_top_level_ranges_and_profiler_steps(self):
        t = _gpu_trace(rank=0, world=1)
        ev = []
        for e in t["traceEvents"]:
            n = e["name"]
            if n.startswith("threewalls:step="):
                e = dict(e, name="ProfilerStep#" + str(40 + int(n.split("=")[1])))
            elif n.startswith("threewalls:"):
                e = dict(e, name="phase_" + rec.parse_annotation(n)["phase"])
            ev.append(e)
        t["traceEvents"] = ev
        p, d = self.write(t)
        out = os.path.join(d, "imp")
        kineto.import_traces([p], scenario=scenario_of(None, None)).write(out, overwrite=False, argv=["test"])
        recs, raw = keyed(out)
        self.assertEqual(sorted({s["step"] for s in raw["steps"]}), [0, 1])
        self.assertEqual(recs[(0, 0, "phase_attn_qkv_fwd", None, None, None)]["wall"], "compute")
        self.assertEqual(recs[(0, 0, "phase_moe_dispatch_fwd", None, None, None)]["wall"], "communication")
        self.assertEqual(recs[(0, 0, "phase_training_metrics_read", None, None, None)]["wall"], "host")
        self.assertNotIn((0, 0, "inner_range", None, None, None), recs)  # nested: belongs to its parent

    def test_bad_traces_are_named(self):
        d = tempdir(self)
        p = os.path.join(d, "cut.json")
        with open(p, "w", encoding="utf-8") as f:
            f.write('{"traceEvents": [{"ph": "X", "name": "a"')
        with self.assertRaisesRegex(InputError, r"cut\.json:1:\d+: not a JSON trace"):
            kineto.import_traces([p], scenario=scenario_of(None, None))
        q, _ = self.write({"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]})
        with self.assertRaisesRegex(InputError, r"traceEvents\[0\]: a complete event needs"):
            kineto.import_traces([q], scenario=scenario_of(None, None))
        r, _ = self.write({"traceEvents": [{"ph": "X", "name": "threewalls:x;layer=1", "ts": 1, "dur": 1}]})
        with self.assertRaisesRegex(InputError, "not a threewalls phase"):
            kineto.import_traces([r], scenario=scenario_of(None, None))
        a, _ = self.write(_gpu_trace(rank=1))
        with self.assertRaisesRegex(InputError, "same rank"):
            kineto.import_traces([a, a], scenario=scenario_of(None, None))
        with self.assertRaisesRegex(InputError, "outside the world"):
            kineto.import_traces([a], scenario=scenario_of(None, None), world_size=1)


NEW_FORMAT = """\
  world_size ...................................... 2
  seq_length ...................................... 4096
  global_batch_size ............................... 8
  log_interval .................................... 1
(min, max) time across ranks (ms):
    model-and-optimizer-setup ......................: (1345.37, 1359.59)
training ...
 [2026-11-27 10:00:00] iteration        1/      10 | consumed samples:            8 | elapsed time per iteration (ms): 2000.5 | throughput per GPU (TFLOP/s/GPU): 312.4 | learning rate: 1.0E-05 | global batch size:     8 | lm loss: 1.0E+01 |
[Rank 1] (after 1 iterations) memory (MB) | allocated: 1000.0 | max allocated: 2048.0 | reserved: 3000.0 | max reserved: 3000.0
(min, max) time across ranks (ms):
    forward-backward ...............................: (1800.10, 1850.25)
    forward-compute ................................: (700.00, 720.50)
    optimizer ......................................: (100.00, 110.00)
 [2026-11-27 10:00:02] iteration        2/      10 | consumed samples:           16 | elapsed time per iteration (ms): 1900.0 | throughput per GPU (TFLOP/s/GPU): 320.0 |
max time across ranks (ms):
    forward-backward ...............................: 1750.00
 [2026-11-27 10:00:04] iteration        3/      10 | consumed samples:           24 | elapsed time per iteration (ms): 1950.0 |
times across ranks (ms):
  forward-backward:
     rank  0: 1700.00
     rank  1: 1790.00
  optimizer:
     rank  0: 90.00
     rank  1: 95.00
"""


class MegatronLog(unittest.TestCase):
    def write(self, text):
        d = tempdir(self)
        p = os.path.join(d, "train.log")
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)
        return p, d

    def test_timer_forms_steps_memory_and_arguments(self):
        p, d = self.write(NEW_FORMAT)
        out = os.path.join(d, "imp")
        run = megatron_log.import_log(p, scenario=scenario_of(None, "qwen"))
        summary = run.write(out, overwrite=False, argv=["test"])
        recs, raw = keyed(out)
        self.assertEqual(sorted((s["step"], s["rank"], s["epoch_us"], s["dur_us"]) for s in raw["steps"]),
                         [(0, 0, 0, 2000500), (1, 0, 2000500, 1900000), (2, 0, 3900500, 1950000),
                          (2, 1, 3900500, 1950000)])
        self.assertEqual(recs[(0, 0, "forward-backward", None, None, None)]["dur_us"], 1850250)
        self.assertEqual(recs[(0, 0, "optimizer", None, None, None)]["wall"], "memory")
        self.assertEqual(recs[(1, 0, "forward-backward", None, None, None)]["dur_us"], 1750000)
        self.assertEqual(recs[(2, 1, "forward-backward", None, None, None)]["dur_us"], 1790000)
        self.assertEqual(recs[(2, 0, "optimizer", None, None, None)]["dur_us"], 90000)
        self.assertNotIn("model-and-optimizer-setup", {k[2] for k in recs})
        self.assertEqual(summary["tokens_per_step"], 8 * 4096)
        self.assertEqual(summary["memory"]["measured_peak_bytes_by_rank"], {"1": 2048 << 20})
        with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
            j = json.load(f)
        self.assertEqual((j["world_size"], j["settings"]["import"]["throughput_tflops_per_gpu"]),
                         (2, [312.4, 320.0, None]))

    def test_errors_name_the_file_and_line(self):
        p, _ = self.write("nothing to see\n")
        with self.assertRaisesRegex(InputError, "no Megatron-LM iteration line"):
            megatron_log.import_log(p, scenario=scenario_of(None, None), world_size=1)
        p, _ = self.write(" iteration 1/ 2 | consumed samples: 1 |\n")
        with self.assertRaisesRegex(InputError, r"train\.log:1: an iteration line without"):
            megatron_log.import_log(p, scenario=scenario_of(None, None), world_size=1)
        p, _ = self.write(" iteration 1/ 2 | elapsed time per iteration (ms): 5.0 |\ntime (ms) | forward: fast\n")
        with self.assertRaisesRegex(InputError, r"train\.log:2: timer 'forward: fast'"):
            megatron_log.import_log(p, scenario=scenario_of(None, None), world_size=1)
        p, _ = self.write(" iteration 1/ 2 | elapsed time per iteration (ms): 5.0 |\n")
        with self.assertRaisesRegex(InputError, "world size is not in the log"):
            megatron_log.import_log(p, scenario=scenario_of(None, None))
        with self.assertRaisesRegex(InputError, "--skip 1: the log has 1"):
            megatron_log.import_log(p, scenario=scenario_of(None, None), world_size=1, skip=1)

    def test_public_example_against_a_simulation(self):
        d = tempdir(self)
        imp, sim = os.path.join(d, "imported"), os.path.join(d, "sim")
        r = importer(self, "megatron-log", os.path.join(SAMPLES, "megatron_bert_example.log"), "--out", imp,
                     "--scenario", TINY)
        self.assertIn("3 step(s)", r.stdout)
        recs, raw = keyed(imp)
        self.assertEqual([s["dur_us"] for s in raw["steps"]], [356200, 140600, 123400])
        self.assertEqual(recs[(1, 0, "optimizer-inner-step", None, None, None)]["dur_us"], 46000)
        self.assertEqual(recs[(0, 0, "backward-params-all-reduce", None, None, None)]["wall"], "communication")
        cli(self, "sim", TINY, "--out", sim)
        c = compare_json(self, imp, sim)
        self.assertTrue(c["megatron_timers"])
        self.assertEqual(c["different_scenarios"], [])
        self.assertEqual(sorted(row["phase"] for row in c["phases"]),
                         ["backward-compute", "forward-compute", "optimizer"])
        self.assertEqual(c["matched_steps"], [0, 1])  # iteration 30's timers are not in the excerpt
        text = cli(self, "compare", imp, sim).stdout
        self.assertIn("Megatron-LM timers", text)


if __name__ == "__main__":
    unittest.main()
