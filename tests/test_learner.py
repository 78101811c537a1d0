"""What a person learning GPU programming meets in a notebook and at the command line: every wrong
name or number answered with the choices, not a bare Python error (emulator, small sizes)."""

from __future__ import annotations

import pytest

import llmcupy
from llmcupy.ops import OpError


def test_an_unknown_version_in_op_versions_lists_the_versions():
    # op.versions[99] in a notebook used to raise a bare `KeyError: 99`
    op = llmcupy.ops["softmax_forward"]
    with pytest.raises(OpError, match=r"softmax_forward has no version 99; versions: 1, 2, 3, 4, 5, 6, 7, 8$"):
        op.versions[99]
    with pytest.raises(KeyError):   # still the KeyError a dict lookup raises, for code that catches it
        op.versions[99]
    assert op.versions.get(99) is None and 99 not in op.versions and op.versions[5].number == 5
