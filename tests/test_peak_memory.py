"""The peak-memory helper measures the child alone: a parent that holds a lot of memory (as the
full suite's pytest process does) must not show up in what the child reports."""

from __future__ import annotations

import numpy as np
from peak_memory import run_child


def test_a_child_reports_its_own_peak_not_its_parents():
    held = np.ones(512 * 2**20, np.uint8)  # touched: 512 MiB resident in this process
    child = run_child("import json\nprint(json.dumps(peak_rss()))")
    assert child < 256 * 2**20, (child, held.nbytes)


def test_a_child_sees_what_it_allocates():
    script = """
        import json
        import numpy as np
        before = peak_rss()
        block = np.ones(128 * 2**20, np.uint8)
        print(json.dumps(peak_rss() - before))
    """
    assert run_child(script) >= 120 * 2**20
