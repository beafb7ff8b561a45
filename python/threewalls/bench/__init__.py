"""Measurements of the package itself (python3 -m threewalls.bench.overhead)."""
