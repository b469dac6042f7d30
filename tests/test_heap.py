"""Batch commands keep freed memory: a second pass over a large array
reuses the pages the first one faulted in, instead of faulting them again."""

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import numpy as np
from netskel.heap import retain_freed_memory
took = retain_freed_memory() if sys.argv[1] == "retain" else None
a = np.ones(32_000_000); del a          # 256 MB, faulted in and freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(32_000_000); del b
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_second_pass_reuses_pages_only_when_retained():
    took, kept = faults("retain")
    _, default = faults("default")
    assert took == "True"
    # 256 MB is 62,500 pages of 4 KB, or 128 huge pages of 2 MB (numpy asks
    # for them): by default the second array faults its pages in again;
    # retained, it reuses the first's.
    assert default >= 100 and kept * 5 < default
