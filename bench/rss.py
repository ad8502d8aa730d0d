"""Resident memory of this process, without psutil: /proc, else ``resource.getrusage``.

The peak is ``VmHWM`` from ``/proc/self/status``: ``getrusage``'s
``ru_maxrss`` is no use in a child process, because Linux carries the
parent's peak across fork and exec into it (a bench process holding a
million prebuilt lines made every child report ~240 MB before it did
anything). ``reset_peak`` writes 5 to ``/proc/self/clear_refs`` (Linux >= 4.0),
which resets ``VmHWM`` to the current RSS, so the peak afterwards is the
peak of what runs afterwards, not of start-up. Where that is not allowed,
the peak stays the peak since exec (said in the result).
"""

from __future__ import annotations

import os
import resource


def current_kb() -> int:
    """Resident set size now, in KiB (from /proc/self/statm)."""
    with open("/proc/self/statm") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") // 1024


def peak_kb() -> int:
    """Peak resident set size, in KiB: VmHWM, else ru_maxrss (KiB on Linux)."""
    try:
        with open("/proc/self/status") as handle:
            for text in handle:
                if text.startswith("VmHWM:"):
                    return int(text.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def reset_peak() -> bool:
    """Make the peak start from now; False when the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return peak_kb() <= current_kb() + 1024
