"""The reference PyTorch runner (docs/python.md): `python3 -m threewalls.runner SCENARIO --out DIR`."""
