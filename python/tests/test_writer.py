"""RunDirWriter: never overwrites, writes nothing when disabled, flushes when the policy says, and a
killed process leaves whole lines and loses at most one flush window."""
import json
import os
import signal
import subprocess
import sys
import time
import unittest

from support import cli, env_with_package, tempdir, threewalls_bin
from threewalls.errors import InputError
from threewalls.profiler import records as rec
from threewalls.profiler.sampling import SamplingConfig, SamplingPolicy
from threewalls.profiler.summary import read_records
from threewalls.profiler.writer import PAGE, RunDirWriter, page_confined


def header(world=1):
    return rec.make_header(world_size=world, tool_version="test", scenario={"name": "t", "path": "", "hash": ""})


def lines_of(path):
    with open(path, "rb") as f:
        return f.read().split(b"\n")


class WriterTest(unittest.TestCase):
    def test_refuses_a_non_empty_directory_unless_overwrite(self):
        d = tempdir(self)
        with open(os.path.join(d, "keep.txt"), "w") as f:
            f.write("x")
        pol = SamplingPolicy(SamplingConfig(record_every_n_steps=1), 1)
        with self.assertRaisesRegex(InputError, "results are never overwritten"):
            RunDirWriter(d, header(), pol)
        with self.assertRaisesRegex(InputError, "is not a run directory"):  # no run.json: not ours to empty
            RunDirWriter(d, header(), pol, overwrite=True)
        RunDirWriter(os.path.join(d, "run"), header(), pol).close()
        d = os.path.join(d, "run")
        with open(os.path.join(d, "keep.txt"), "w") as f:
            f.write("x")
        w = RunDirWriter(d, header(), pol, overwrite=True)
        w.close()
        self.assertTrue(os.path.exists(os.path.join(d, "keep.txt")))  # other files are left alone
        self.assertTrue(os.path.exists(os.path.join(d, "run.json")))

    def test_disabled_writes_nothing(self):
        d = os.path.join(tempdir(self), "run")
        w = RunDirWriter(d, header(), SamplingPolicy(SamplingConfig(enabled=False), 1))
        self.assertFalse(w.add_step(0, 0, 0.0, 1.0))
        w.close()
        self.assertFalse(os.path.exists(d))

    def test_flushes_when_the_policy_says_and_closes_with_a_footer(self):
        d = os.path.join(tempdir(self), "run")
        w = RunDirWriter(d, header(), SamplingPolicy(SamplingConfig(record_every_n_steps=2, flush_every_n_steps=4), 1))
        path = os.path.join(d, "phases_rank_0.jsonl")
        for step in range(8):
            added = w.add_phase(step=step, rank=0, phase="p", stream="compute", start_us=1, dur_us=2, wall="compute")
            self.assertEqual(added, step % 2 == 0)
            w.add_step(step, 0, 10.0 * step, 5.0)
            w.end_step(step)
            n = len([x for x in lines_of(path) if x])
            if step == 2:
                self.assertEqual(n, 1)  # only the header: steps 0-2 are buffered
            if step == 3:
                self.assertEqual(n, 1 + 6)  # flush after step 3: steps 0 and 2, a phase, a step and a step_end each
        self.assertFalse(w.add_phase(step=9, rank=1, phase="p", stream="c", start_us=0, dur_us=1, wall="compute"))
        w.close()
        last = json.loads(lines_of(path)[-2])
        self.assertEqual(last, {"record": "footer", "run_id": w.header["run_id"], "records": 4, "steps": [0, 2, 4, 6]})
        with self.assertRaisesRegex(InputError, "wall 'gpu'; allowed: compute, memory, communication, host"):
            RunDirWriter(os.path.join(tempdir(self), "r"), header(), SamplingPolicy(None, 1)).add_phase(
                step=0, rank=0, phase="p", stream="c", start_us=0, dur_us=1, wall="gpu")

    def test_lines_never_cross_a_page_boundary(self):
        lines = ["x" * 100] * 100 + ["y" * (PAGE - 1)] + ["z" * (PAGE + 10)]
        data = page_confined(lines, 7)
        pos = 7
        for line in data.split(b"\n")[:-1]:
            n = len(line) + 1
            if n <= PAGE:
                self.assertEqual(pos // PAGE, (pos + n - 1) // PAGE)
            pos += n
        self.assertEqual([x for x in data.split(b"\n") if x.strip()], [x.encode() for x in lines])

    def test_multi_process_layout_join(self):
        d = os.path.join(tempdir(self), "run")
        pol = SamplingPolicy(SamplingConfig(record_every_n_steps=1), 2)
        w0 = RunDirWriter(d, header(2), pol, local_ranks=[0])
        w1 = RunDirWriter(d, header(2), pol, mode="join", local_ranks=[1])
        for w, r in ((w0, 0), (w1, 1)):
            w.add_phase(step=0, rank=r, phase="a", stream="compute", start_us=0, dur_us=1, wall="compute")
            w.add_step(0, r, 0, 1)
            w.close()
        recs = read_records(d)
        self.assertEqual(sorted(p["rank"] for p in recs["phases"]), [0, 1])
        with self.assertRaisesRegex(InputError, "does not exist"):
            RunDirWriter(os.path.join(d, "absent"), header(2), pol, mode="join", local_ranks=[1])

    def test_a_killed_process_leaves_whole_lines_and_loses_at_most_one_flush_window(self):
        # Two children, killed at different points (big flush windows make a kill inside a write likely).
        for extra in (2, 7):
            self.kill_child(extra)

    def kill_child(self, extra: int):
        d = os.path.join(tempdir(self), "run")
        flush = 5
        child = f"""
import sys, time
from threewalls.profiler import Profiler, SamplingConfig
prof = Profiler({d!r}, sampling=SamplingConfig(record_every_n_steps=1, flush_every_n_steps={flush}), use_cuda=False)
step = 0
while True:
    prof.begin_step(step)
    for layer in range(400):
        with prof.phase("layer_fwd", layer=layer, flops=1e9, bytes=4096):
            sum(range(200))
    prof.end_step()
    print(step, flush=True)
    step += 1
"""
        p = subprocess.Popen([sys.executable, "-c", child], env=env_with_package(), stdout=subprocess.PIPE, text=True)
        reported = -1
        deadline = time.monotonic() + 60
        while reported < 3 * flush + extra and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            reported = int(line)
        os.kill(p.pid, signal.SIGKILL)
        rest = p.stdout.read()
        p.stdout.close()
        p.wait()
        for line in rest.split():
            reported = max(reported, int(line))
        self.assertGreaterEqual(reported, 3 * flush, "the child did not get far enough")
        raw = lines_of(os.path.join(d, "phases_rank_0.jsonl"))
        self.assertEqual(raw[-1], b"", "the file does not end with a whole line")
        parsed = [json.loads(x) for x in raw[:-1] if x.strip()]  # every line parses: none is torn
        self.assertEqual(parsed[0]["record"], "header")
        self.assertNotIn("footer", [x.get("record") for x in parsed])
        whole = sorted(x["step"] for x in parsed if x.get("record") == "step")
        self.assertEqual(whole, list(range(len(whole))))
        last_on_disk = whole[-1]
        # A step with its step record on disk has all its phases before it; a kill inside a flush may
        # leave part of the next step's phases, which readers drop.
        for s in whole:
            self.assertEqual(sum(1 for x in parsed[1:] if x["step"] == s and "record" not in x), 400)
        self.assertLessEqual({x["step"] for x in parsed[1:]} - set(whole), {last_on_disk + 1})
        # Records are formatted during the next step and flushed at flush points: every step up to
        # `reported` - flush_every_n_steps has reached the disk.
        self.assertGreaterEqual(last_on_disk, reported - flush, "more than one flush window was lost")
        sizes = [len(x) + 1 for x in raw[:-1]]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        for off, n in zip(offsets, sizes):  # no line crosses a page boundary of the file
            self.assertEqual(off // PAGE, (off + n - 1) // PAGE, (off, n))
        if threewalls_bin():
            r = cli(self, "analyze", d, check=False)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no footer record", r.stderr)
            r = cli(self, "analyze", d, "--allow-incomplete")
            self.assertIn("cut short", r.stderr)


if __name__ == "__main__":
    unittest.main()
