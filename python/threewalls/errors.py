"""Errors of the threewalls package. Bad input (a knob, a scenario key, a record) raises InputError
with a message naming the file, key and allowed values, as the C++ tool does."""


class InputError(ValueError):
    """Bad input: the message names what is wrong and what is allowed."""


class UnsupportedError(InputError):
    """A valid scenario feature that the PyTorch reference runner does not execute."""
