"""The package installs with pip from the checkout (offline: the system's setuptools, no deps) and
runs from the install: the profiler imports, the runner's command line answers."""
import os
import shutil
import subprocess
import sys
import unittest

from support import PYROOT, tempdir


class InstallTest(unittest.TestCase):
    def test_pip_install_target_and_run_from_it(self):
        d = tempdir(self)
        src = os.path.join(d, "src")
        shutil.copytree(PYROOT, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
        site = os.path.join(d, "site")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                            "--no-cache-dir", "--target", site, src], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = site
        code = ("import threewalls, threewalls.profiler, threewalls.runner.run as r; "
                "print(threewalls.__file__); print(threewalls.__version__)")
        r = subprocess.run([sys.executable, "-c", code], cwd=d, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(os.path.join(site, "threewalls")), r.stdout)
        r = subprocess.run([sys.executable, "-m", "threewalls.runner", "--help"], cwd=d, env=env, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("scenario", r.stdout)
        self.assertTrue(os.path.exists(os.path.join(site, "bin", "threewalls-torch")))


if __name__ == "__main__":
    unittest.main()
