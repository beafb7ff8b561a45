"""python3 -m threewalls.importers kineto|megatron-log ...: a real run's trace or log -> run directory."""
from __future__ import annotations

import argparse
import sys

from threewalls.errors import InputError
from threewalls.importers import kineto, megatron_log
from threewalls.importers.output import scenario_of


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m threewalls.importers",
                                 description="A real run's PyTorch profiler trace or Megatron-LM log -> a threewalls "
                                             "run directory (docs/python.md, 'Importing real runs')")
    sub = ap.add_subparsers(dest="kind", required=True)
    k = sub.add_parser("kineto", help="PyTorch profiler Chrome traces (one per rank) -> run directory")
    k.add_argument("traces", nargs="+", metavar="TRACE_JSON")
    m = sub.add_parser("megatron-log", help="Megatron-LM training log (iteration lines, timers, memory) -> run "
                                            "directory")
    m.add_argument("log", metavar="LOG")
    m.add_argument("--skip", type=int, default=0, help="logged iterations to leave out first (warm-up)")
    for p in (k, m):
        p.add_argument("--out", required=True, help="run directory to write")
        p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
        p.add_argument("--scenario", help="the scenario the run executed: its name and hash go into the header, so "
                                          "`threewalls compare` lines the run up with `threewalls sim` of it")
        p.add_argument("--name", help="scenario name in the header (default: the scenario's, else 'imported')")
        p.add_argument("--world-size", type=int, help="GPUs of the run (default: from the files, else the scenario)")
    args = ap.parse_args(argv)
    try:
        scen = scenario_of(args.scenario, args.name)
        if args.kind == "kineto":
            run = kineto.import_traces(args.traces, scenario=scen, world_size=args.world_size)
        else:
            run = megatron_log.import_log(args.log, scenario=scen, world_size=args.world_size, skip=args.skip)
        summary = run.write(args.out, args.overwrite, argv=["python3", "-m", "threewalls.importers"] +
                            list(sys.argv[1:] if argv is None else argv))
    except (InputError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    un = run.settings["import"].get("unattributed_device_us") or {}
    for r, us in sorted(un.items()):
        if us > 0:
            print(f"note: rank {r}: {us:.1f} us of device activity launched outside every phase range "
                  "(settings.import.unattributed_device_us)", file=sys.stderr)
    st = summary["step_time_us"]
    print(f"run directory {args.out}: {len(summary['steps'])} step(s), {run.world_size} GPU(s), step time median "
          f"{st['median'] / 1000:.3f} ms ({args.kind})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
