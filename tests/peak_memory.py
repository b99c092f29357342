"""Peak resident memory of code run in a child process, for the tests that prove a tensor is never
materialised.

The peak is the child's own ``VmHWM`` (the high-water mark of its address space), never
``ru_maxrss``: Linux carries ``ru_maxrss`` over fork and exec, so a child of a pytest process
that has grown to 2 GB reports 2 GB for every run it makes, and a growth measured from it reads 0
(a fused and an unfused model then look the same; the full suite failed exactly so)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# Pasted in front of every child script: ``peak_rss()`` is what the script reports.
_CHILD_PRELUDE = textwrap.dedent("""
    def peak_rss() -> int:
        \"\"\"Bytes: this process's own high-water mark, not inherited from the parent.\"\"\"
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("/proc/self/status has no VmHWM")
""")


def run_child(script: str, *args: str) -> object:
    """Runs ``script`` (which may call ``peak_rss()``) in a fresh interpreter with ``args`` as
    ``sys.argv[1:]`` and returns the JSON value its last stdout line holds."""
    code = _CHILD_PRELUDE + textwrap.dedent(script)
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
