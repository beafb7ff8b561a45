"""The profiler in a PyTorch loop on the CPU (host clock), and its CUDA path where a GPU is."""
import json
import os
import unittest

from support import SKIP_NO_CUDA, cli, cuda_available, tempdir, threewalls_bin
from threewalls.errors import InputError
from threewalls.profiler import Profiler, SamplingConfig
from threewalls.profiler.summary import read_records

import torch


def small_loop(prof, steps=6, hook=True):
    torch.manual_seed(0)
    lin1 = torch.nn.Linear(32, 64)
    lin2 = torch.nn.Linear(64, 32)
    if hook:
        prof.hook_module(lin1, "fc1", layer=0, flops=2 * 16 * 32 * 64)
        prof.hook_module(lin2, "fc2", layer=0)
    x = torch.randn(16, 32, requires_grad=True)
    for step in range(steps):
        with prof.step(step):
            with prof.phase("host_to_device", wall="memory", bytes=16 * 32 * 4, coarse="host_to_device"):
                xi = x * 1.0
            y = lin2(torch.relu(lin1(xi)))
            loss = y.square().mean()
            loss.backward()
            with prof.host_phase("training_metrics_read", coarse="training_metrics", waits_for_device=True):
                loss.item()


class OneQueueWarningTest(unittest.TestCase):
    def test_only_one_hardware_queue_earns_the_warning(self):
        from threewalls.profiler.profiler import one_queue_warning
        self.assertIn("CUDA_DEVICE_MAX_CONNECTIONS=1", one_queue_warning({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}))
        self.assertIn("record_every_n_steps", one_queue_warning({"CUDA_DEVICE_MAX_CONNECTIONS": " 1 "}))
        for env in ({}, {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}):
            self.assertIsNone(one_queue_warning(env), env)


class ProfilerCpuTest(unittest.TestCase):
    def test_phases_hooks_and_step_records(self):
        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=2, flush_every_n_steps=2), use_cuda=False,
                        scenario={"name": "loop", "path": "", "hash": ""})
        small_loop(prof)
        prof.finish(tokens_per_step=16)
        recs = read_records(d)
        self.assertEqual(sorted({s["step"] for s in recs["steps"]}), [0, 2, 4])
        by_step = {}
        for p in recs["phases"]:
            by_step.setdefault(p["step"], []).append(p)
        for step, ps in by_step.items():
            names = [p["phase"] for p in ps]
            self.assertEqual(names, ["host_to_device", "fc1_fwd", "fc2_fwd", "fc2_bwd", "fc1_bwd",
                                     "training_metrics_read"])
            ends = {p["phase"]: p["start_us"] + p["dur_us"] for p in ps}
            starts = {p["phase"]: p["start_us"] for p in ps}
            # Backward runs last layer first: fc2's backward ends before fc1's starts.
            self.assertLessEqual(ends["fc2_bwd"], starts["fc1_bwd"] + 1e-3)
            self.assertLessEqual(ends["fc1_fwd"], starts["fc2_fwd"] + 1e-3)
            step_rec = [s for s in recs["steps"] if s["step"] == step][0]
            self.assertGreaterEqual(step_rec["dur_us"] + 1e-3, max(ends.values()))
        fc1 = [p for p in recs["phases"] if p["phase"] == "fc1_fwd"][0]
        self.assertEqual((fc1["layer"], fc1["flops"], fc1["wall"], fc1["stream"]), (0, 2 * 16 * 32 * 64, "compute",
                                                                                     "compute"))
        read = [p for p in recs["phases"] if p["phase"] == "training_metrics_read"][0]
        self.assertEqual((read["stream"], read["wall"], read["coarse"]), ("host", "host", "training_metrics"))
        self.assertEqual(recs["footers"][0], {"record": "footer", "run_id": recs["headers"][0]["run_id"], "records": 18,
                                              "steps": [0, 2, 4]})
        with open(os.path.join(d, "summary.json")) as f:
            summ = json.load(f)
        self.assertEqual([s["step"] for s in summ["steps"]], [0, 2, 4])
        self.assertEqual(summ["phases"][0]["phase"], "host_to_device")
        self.assertEqual(summ["phases"][1]["count"], 3)
        self.assertGreater(summ["steps"][0]["tokens_per_s"], 0)
        if threewalls_bin():
            out = cli(self, "analyze", d).stdout
            self.assertIn("rank", out)
            cmp = cli(self, "compare", d, d).stdout
            self.assertIn("matched records: 18 over 3 step(s); only in A: 0; only in B: 0", cmp)

    def test_module_hooks_are_on_the_modules_only_during_recorded_steps(self):
        """An unrecorded step calls the modules without hooks (PyTorch's path without them); a recorded
        step has them; remove() takes them off for good."""
        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=3), use_cuda=False,
                        scenario={"name": "loop", "path": "", "hash": ""})
        lin = torch.nn.Linear(4, 4)
        handles = prof.hook_module(lin, "fc", layer=0)
        seen = []
        x = torch.randn(2, 4, requires_grad=True)
        for step in range(5):
            with prof.step(step):
                seen.append((len(lin._forward_pre_hooks), len(lin._forward_hooks)))
                lin(x).sum().backward()
        self.assertEqual(seen, [(1, 1), (0, 0), (0, 0), (1, 1), (0, 0)])
        for h in handles:
            h.remove()
        with prof.step(6):
            self.assertEqual((len(lin._forward_pre_hooks), len(lin._forward_hooks)), (0, 0))
            lin(x).sum().backward()
        prof.finish(summary=False)
        recs = read_records(d)
        self.assertEqual(sorted({(p["step"], p["phase"]) for p in recs["phases"]}),
                         [(0, "fc_bwd"), (0, "fc_fwd"), (3, "fc_bwd"), (3, "fc_fwd")])

    def test_coarse_granularity_and_unrecorded_steps(self):
        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=5, granularity="coarse"), use_cuda=False)
        small_loop(prof, steps=7)
        prof.finish()
        recs = read_records(d)
        self.assertEqual(sorted({p["phase"] for p in recs["phases"]}), ["host_to_device", "training_metrics_read"])
        self.assertEqual(sorted({p["step"] for p in recs["phases"]}), [0, 5])

    def test_disabled_profiler_creates_nothing(self):
        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(enabled=False), use_cuda=False)
        small_loop(prof, steps=3)
        prof.finish()
        self.assertFalse(os.path.exists(d))

    def test_misuse_is_an_error(self):
        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=1), use_cuda=False)
        prof.begin_step(0)
        with self.assertRaises(RuntimeError):
            prof.begin_step(1)
        with self.assertRaisesRegex(InputError, "wall 'disk'"):
            prof.phase("x", wall="disk")
        prof.end_step()
        with self.assertRaisesRegex(InputError, "steps must increase"):
            prof.begin_step(0)
        with self.assertRaisesRegex(InputError, "nvtx 'some'"):
            Profiler(os.path.join(d, "x"), nvtx="some", use_cuda=False)
        prof.finish()

    def test_a_step_that_raises_is_dropped_and_the_run_reads_as_cut_short(self):
        d = os.path.join(tempdir(self), "run")
        with self.assertRaises(ZeroDivisionError):
            with Profiler(d, sampling=SamplingConfig(record_every_n_steps=1), use_cuda=False) as prof:
                with prof.step(0):
                    with prof.phase("a"):
                        pass
                with prof.step(1):
                    with prof.phase("a"):
                        1 / 0
        recs = read_records(d)
        self.assertEqual({p["step"] for p in recs["phases"]}, {0})
        self.assertEqual(recs["footers"], {})
        if threewalls_bin():
            r = cli(self, "analyze", d, check=False)
            self.assertIn("no footer record", r.stderr)


class ProfilerProcessesTest(unittest.TestCase):
    def test_two_processes_without_torch_distributed(self):
        import subprocess
        import sys
        from support import env_with_package
        d = os.path.join(tempdir(self), "run")
        code = f"""
import sys, time
from threewalls.profiler import Profiler, SamplingConfig
rank = int(sys.argv[1])
prof = Profiler({d!r}, rank=rank, world_size=2, sampling=SamplingConfig(record_every_n_steps=1), use_cuda=False)
for step in range(3):
    with prof.step(step):
        with prof.phase("work", layer=0):
            time.sleep(0.005 + 0.06 * rank)
prof.finish()
"""
        procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], env=env_with_package(), stderr=subprocess.PIPE,
                                  text=True) for r in (1, 0)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, err)
        recs = read_records(d)
        self.assertEqual(sorted({(p["rank"], p["step"]) for p in recs["phases"]}),
                         [(r, s) for r in (0, 1) for s in range(3)])
        with open(os.path.join(d, "summary.json")) as f:
            summ = json.load(f)
        self.assertEqual([s["critical_rank"] for s in summ["steps"]], [1, 1, 1])
        with open(os.path.join(d, "run.json")) as f:
            self.assertEqual(json.load(f)["ranks"], [0, 1])
        if threewalls_bin():
            cli(self, "analyze", d)


@unittest.skipUnless(cuda_available(), SKIP_NO_CUDA)
class ProfilerCudaTest(unittest.TestCase):
    def test_events_on_two_streams(self):
        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=1))
        side = torch.cuda.Stream()
        prof.name_stream(side, "expert_1")
        a = torch.randn(2048, 2048, device="cuda")
        for step in range(4):
            with prof.step(step):
                with prof.phase("mm", flops=2 * 2048 ** 3):
                    b = a @ a
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    with prof.phase("mm_side"):
                        c = b @ a
                torch.cuda.current_stream().wait_stream(side)
        prof.finish()
        recs = read_records(d)
        side_recs = [p for p in recs["phases"] if p["phase"] == "mm_side"]
        self.assertEqual({p["stream"] for p in side_recs}, {"expert_1"})
        for s in recs["steps"]:
            ps = [p for p in recs["phases"] if p["step"] == s["step"]]
            mm = [p for p in ps if p["phase"] == "mm"][0]
            sd = [p for p in ps if p["phase"] == "mm_side"][0]
            self.assertGreater(mm["dur_us"], 10)
            self.assertGreaterEqual(sd["start_us"] + 1, mm["start_us"] + mm["dur_us"])
            self.assertGreaterEqual(s["dur_us"] + 1, sd["start_us"] + sd["dur_us"])
        with open(os.path.join(d, "summary.json")) as f:
            self.assertGreater(json.load(f)["memory"]["measured_peak_bytes_by_rank"]["0"], 0)

    def test_stamps_on_the_timer_stream_time_what_stamps_on_the_stream_do(self):
        """The default stamps (a marker on the stream, the timing event on the timer stream) give the
        durations and offsets of stamps recorded on the timed stream itself."""
        a = torch.randn(2048, 2048, device="cuda")
        got = {}
        for stamps in ("stream", "shadow"):
            d = os.path.join(tempdir(self), stamps)
            prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=1), stamps=stamps)
            # On a machine with an NVIDIA driver the events are the driver's (cuda_driver).
            self.assertIsNotNone(prof._driver)
            for step in range(4):
                with prof.step(step):
                    with prof.phase("mm4"):
                        b = a
                        for _ in range(4):
                            b = b @ a
                    with prof.phase("add"):
                        b.add_(1.0)
                    with prof.phase("mm1"):
                        b @ a
            prof.finish(summary=False)
            recs = [p for p in read_records(d)["phases"] if p["step"] > 0]
            got[stamps] = {n: sorted(p["dur_us"] for p in recs if p["phase"] == n) for n in ("mm4", "add", "mm1")}
            got[stamps]["mm1_start"] = sorted(p["start_us"] for p in recs if p["phase"] == "mm1")
        for n in ("mm4", "mm1", "mm1_start"):
            s, h = got["stream"][n][1], got["shadow"][n][1]
            self.assertAlmostEqual(h, s, delta=0.05 * s + 10, msg=n)
        self.assertLess(got["shadow"]["add"][1], got["shadow"]["mm1"][1])

    def test_a_host_read_waits_for_the_device_without_a_synchronisation(self):
        """The read's record starts where the device finished the work queued before it, and entering
        the phase does not wait for that work (the profiler adds no synchronisation)."""
        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=1))
        a = torch.randn(4096, 4096, device="cuda")
        busy_inside = []
        for step in range(3):
            with prof.step(step):
                with prof.phase("mm"):
                    b = a
                    for _ in range(8):
                        b = b @ a
                with prof.host_phase("read", waits_for_device=True):
                    busy_inside.append(not torch.cuda.current_stream().query())
                    b[0, 0].item()
        prof.finish(summary=False)
        self.assertEqual(busy_inside, [True] * 3)
        recs = read_records(d)
        for s in recs["steps"]:
            ps = {p["phase"]: p for p in recs["phases"] if p["step"] == s["step"]}
            mm, rd = ps["mm"], ps["read"]
            self.assertEqual(rd["stream"], "host")
            self.assertGreater(mm["dur_us"], 1000)
            # The read starts after the products (within the host/device clock alignment) and holds
            # only the copy and the return, not the wait.
            self.assertGreater(rd["start_us"], mm["start_us"] + mm["dur_us"] - 50)
            self.assertLess(rd["dur_us"], mm["dur_us"] / 4)


class HookedModuleCallsTest(unittest.TestCase):
    """hook_module with the micro-batch given by a callable, the module called with positional and
    (PyTorch 2.0 on) keyword inputs."""

    def run_block(self, keyword: bool):
        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 8)

            def forward(self, hidden_states=None):
                return self.lin(hidden_states)

        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=1), use_cuda=False)
        blk = Block()
        mb = {"k": 0}
        prof.hook_module(blk, "blk", layer=0, microbatch=lambda: mb["k"])
        x = torch.randn(4, 8, requires_grad=True)
        with prof.step(0):
            for k in range(2):
                mb["k"] = k
                y = blk(hidden_states=x * 1.0) if keyword else blk(x * 1.0)
                y.sum().backward()
        prof.finish(summary=False)
        got = sorted((p["phase"], p["microbatch"]) for p in read_records(d)["phases"])
        self.assertEqual(got, [("blk_bwd", 0), ("blk_bwd", 1), ("blk_fwd", 0), ("blk_fwd", 1)])

    def test_positional_inputs_and_the_micro_batch_of_each_call(self):
        self.run_block(keyword=False)

    def test_the_modules_output_is_its_own_tensor_and_takes_in_place_ops(self):
        """The forward hook leaves the module's output as it is (a tensor hook marks where its
        gradient is complete), so the caller gets the module's own tensor and may change it in
        place; the backward phase is still recorded, after the forward one."""
        class Scale(torch.nn.Module):
            def forward(self, x):
                self.out = x * 3.0
                return self.out

        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=1), use_cuda=False)
        mod = Scale()
        prof.hook_module(mod, "scale", layer=0)
        x = torch.randn(4, requires_grad=True)
        with prof.step(0):
            y = mod(x * 1.0)
            self.assertIs(y, mod.out)
            y.add_(1.0)
            y.sum().backward()
        prof.finish(summary=False)
        torch.testing.assert_close(x.grad, torch.full((4,), 3.0))
        phases = read_records(d)["phases"]
        self.assertEqual([p["phase"] for p in phases], ["scale_fwd", "scale_bwd"])
        self.assertGreaterEqual(phases[1]["start_us"] + 1e-3, phases[0]["start_us"] + phases[0]["dur_us"])

    @unittest.skipIf(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 0),
                     f"PyTorch {torch.__version__}: forward pre-hooks see keyword inputs from 2.0 on")
    def test_keyword_inputs_get_the_backward_phase(self):
        self.run_block(keyword=True)


class ProfilerHarvestTest(unittest.TestCase):
    def test_overdue_records_are_formatted_at_the_step_start(self):
        """Records wait at most about one step: begin_step formats the steps before the last recorded
        one and every step before a flush point reached, and leaves the last step alone otherwise."""
        d = os.path.join(tempdir(self), "run")
        prof = Profiler(d, sampling=SamplingConfig(record_every_n_steps=1, flush_every_n_steps=3), use_cuda=False)
        prof.begin_step(0)
        with prof.phase("a"):
            pass
        prof.end_step()
        prof._device_busy = lambda: False  # no phase call finds time to format
        prof.begin_step(1)
        self.assertEqual([x.step for x in prof._pending], [0])  # the last step waits
        with prof.phase("a"):
            pass
        prof.end_step()
        prof.begin_step(2)
        self.assertEqual([x.step for x in prof._pending], [1])  # step 0 was overdue
        with prof.phase("a"):
            pass
        prof.end_step()  # step 2 ends a flush window
        prof.begin_step(3)
        self.assertEqual(list(prof._pending), [])
        self.assertEqual(prof.writer.phase_records_written, 3)
        prof.end_step()
        prof.finish(summary=False)


if __name__ == "__main__":
    unittest.main()
