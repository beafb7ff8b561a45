"""The Python writer spells records as the C++ writer does, and knows the fields the format has."""
import os
import re
import unittest

from support import REPO, cli
from threewalls.profiler import records as rec


def doc_fields(section: str) -> set:
    """Field names in the first column of the table under `### <section>` of docs/formats/run_dir.md."""
    with open(os.path.join(REPO, "docs", "formats", "run_dir.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index(f"### {section}")
    end = text.find("\n#", start + 4)
    names = set()
    for line in text[start:end].splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return names


class RecordsTest(unittest.TestCase):
    def test_times_are_rounded_to_the_nanosecond_and_counts_to_integers(self):
        # The same cases as tests/profiler/run_dir_test.cpp (TimesAreWrittenRoundedToTheNanosecond...).
        line = rec.phase_line(0, 0, rec.json_string('a"b'), None, None, rec.json_string("compute"), -0.0015,
                              12.34567, "compute", 4096, 1.5)
        self.assertEqual(line, '{"step":0,"rank":0,"phase":"a\\"b","layer":null,"microbatch":null,"stream":"compute",'
                               '"start_us":-0.002,"dur_us":12.346,"wall":"compute","bytes":4096,"flops":2}')
        self.assertIn('"bytes":1e+20,', rec.phase_line(0, 0, '"p"', 1, 2, '"s"', 0, 1, "memory", 1e20, 0))
        self.assertEqual(rec.step_line(3, 1, 1234567890.1234, 100.0),
                         '{"record":"step","step":3,"rank":1,"epoch_us":1234567890.123,"dur_us":100}')
        self.assertEqual(rec.format_time_us(12.5), "12.5")
        self.assertEqual(rec.format_time_us(0.001), "0.001")
        self.assertEqual(rec.format_time_us(0.0004), "0")
        self.assertEqual(rec.format_time_us(2.5e-3), "0.003")  # halves away from zero, as llround
        with self.assertRaises(ValueError):
            rec.format_time_us(float("nan"))
        with self.assertRaises(ValueError):
            rec.format_count(-1)

    def test_optional_fields_in_the_writer_order(self):
        line = rec.phase_line(1, 2, '"moe_dispatch_fwd"', 3, 0, '"compute"', 1, 2, "communication", 8, 0,
                              expert=4, peer=1, group_json='"ep"', group_id=0, tokens=64, coarse="host_to_device")
        keys = re.findall(r'"([a-z_]+)":', line)
        self.assertEqual(keys, list(rec.PHASE_REQUIRED) + [k for k in rec.PHASE_OPTIONAL if k != "launch_wait_us"])

    def test_field_lists_match_the_format_documentation(self):
        self.assertEqual(set(rec.PHASE_REQUIRED) | set(rec.PHASE_OPTIONAL), doc_fields("Phase record"))
        self.assertEqual(set(rec.STEP_KEYS), doc_fields("Step record"))
        self.assertEqual(set(rec.HEADER_KEYS), doc_fields("Header record"))
        self.assertEqual(rec.SCHEMA_VERSION, re.search(r"`threewalls.run_dir` (\d+\.\d+)",
                                                       open(os.path.join(REPO, "docs", "formats", "run_dir.md"),
                                                            encoding="utf-8").read()).group(1))

    def test_header_and_run_json(self):
        h = rec.make_header(world_size=2, tool_version="t", scenario={"name": "n", "path": "p", "hash": "h"},
                            device="d", argv=["a"], start_time="2026-01-01T00:00:00Z", seed=7,
                            settings={"x": 1}, rank_classes=[{"id": 0, "label": "stage 0", "ranks": [0, 1],
                                                             "pp_stage": 0}])
        import json
        line = json.loads(rec.header_line(h, 1))
        self.assertEqual(list(line), list(rec.HEADER_KEYS))
        self.assertEqual(line["rank_class"], 0)
        rj = rec.run_json(h, [0, 1])
        self.assertEqual(list(rj), list(rec.RUN_JSON_KEYS))
        with self.assertRaises(ValueError):
            rec.make_header(world_size=1, tool_version="t", source="measured")

    def test_the_cpp_writer_emits_exactly_these_keys_and_names(self):
        # The C++ records owner (records/, profiler/) is the judge: a simulated run with pipeline
        # send/recv (peer), collectives (group, group_id), MoE ops (tokens) and the coarse view
        # writes only keys of the lists above, in their order, and only names of WALLS, GROUPS and
        # COARSE_VIEWS; its header, step, footer and run.json keys are exactly the lists'.
        import json
        import tempfile
        scenario = os.path.join(REPO, "scenarios", "validation", "fidelity", "f10_moe32_pp2_2gpu.toml")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "run")
            cli(self, "sim", scenario, "--out", out)
            with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
                run = json.load(f)
            self.assertEqual(list(run), list(rec.RUN_JSON_KEYS))
            self.assertEqual(run["schema_version"], rec.SCHEMA_VERSION)
            order = list(rec.PHASE_REQUIRED) + list(rec.PHASE_OPTIONAL)
            seen = set()
            files = [n for n in os.listdir(out) if n.startswith("phases_rank_")]
            self.assertTrue(files)
            for name in files:
                with open(os.path.join(out, name), encoding="utf-8") as f:
                    lines = [json.loads(line) for line in f]
                self.assertEqual(list(lines[0]), list(rec.HEADER_KEYS))
                self.assertEqual(list(lines[-1]), list(rec.FOOTER_KEYS))
                for line in lines[1:-1]:
                    keys = list(line)
                    if line.get("record") == "step":
                        self.assertEqual(keys, list(rec.STEP_KEYS))
                        continue
                    if line.get("record") == "step_end":
                        self.assertEqual(keys, list(rec.STEP_END_KEYS))
                        continue
                    self.assertEqual(keys[:len(rec.PHASE_REQUIRED)], list(rec.PHASE_REQUIRED))
                    self.assertEqual(keys, sorted(keys, key=order.index))  # a subsequence of the writer's order
                    seen.update(keys)
                    self.assertIn(line["wall"], rec.WALLS)
                    if "group" in line:
                        self.assertIn(line["group"], rec.GROUPS)
                    if "coarse" in line:
                        self.assertIn(line["coarse"], rec.COARSE_VIEWS)
            for key in ("peer", "group", "group_id", "tokens", "coarse"):
                self.assertIn(key, seen)

    def test_scenario_hash_is_fnv1a_64(self):
        self.assertEqual(rec.fnv1a64_hex(b""), "cbf29ce484222325")
        self.assertEqual(rec.fnv1a64_hex(b"a"), "af63dc4c8601ec8c")


if __name__ == "__main__":
    unittest.main()
