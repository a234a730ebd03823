"""The memory a job costs a laptop: the resident memory of every process it runs, sampled.

`TreeMemory` samples this process and all its descendants (Ray's GCS, raylet, agents and
worker actors are children of a local ``ray.init``; engine servers are children too) on a
thread, and keeps the peak of their summed RSS and each process's own peak, by role.
Summed RSS counts a page shared by two processes twice (torch's libraries, say): it is the
upper figure a user's task manager adds up, not the smaller proportional one (PSS).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import psutil

GB = 2**30


def role(proc: psutil.Process, root: int) -> str:
    """What a process is to the job: the driver, a Ray actor by class, or Ray's own servers."""
    if proc.pid == root:
        return "driver"
    try:
        title = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "gone"
    if "multiprocessing.spawn" in title:  # a spawned child, e.g. an isolated cached_build
        return "spawned"
    if "multiprocessing.resource_tracker" in title:
        return "resource_tracker"
    if title.startswith("ray::"):  # a Ray worker titles itself ray::Class or ray::IDLE
        return title.split()[0].split(".")[0]  # ray::PolicyWorker.update -> ray::PolicyWorker
    for known in ("gcs_server", "raylet", "dashboard", "runtime_env", "log_monitor", "monitor"):
        if known in title:
            return f"ray:{known}"
    words = title.split()
    if "-m" in words[:-1]:  # python -m package.module: the module
        return words[words.index("-m") + 1]
    scripts = [w for w in words[1:] if w.endswith(".py")]
    if scripts:  # python -P .../agentrl_sdk/tracing/_writer_process.py: the file's name
        return scripts[0].rsplit("/", 1)[-1].removesuffix(".py")
    return proc.name()


class TreeMemory:
    """Samples the RSS of this process tree every ``interval_s`` until `stop`.

    Attributes:
        peak_sum: The largest summed RSS of one sample, in bytes.
        peaks: Each role's largest RSS (the sum over its processes in one sample), in bytes.
        phase: What the job is doing now, set by the caller (e.g. "model build", "training"):
            the summed peak of each phase is kept, and the phase the overall peak fell in.
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.peak_sum = 0
        self.peaks: dict[str, int] = defaultdict(int)
        self.at_peak: dict[str, int] = {}
        self.peak_time = 0.0  # when the summed peak was sampled (epoch seconds)
        self.phase = ""
        self.peak_phase = ""
        self.phase_peaks: dict[str, int] = defaultdict(int)
        self.started = time.time()
        self._root = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tree-memory")

    def __enter__(self) -> TreeMemory:
        self.started = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        """One sample of every process in the tree."""
        by_role: dict[str, int] = defaultdict(int)
        for proc in [self._root, *self._root.children(recursive=True)]:
            try:
                by_role[role(proc, self._root.pid)] += proc.memory_info().rss
            except psutil.Error:  # it ended between the listing and the read
                continue
        for name, rss in by_role.items():
            self.peaks[name] = max(self.peaks[name], rss)
        total = sum(by_role.values())
        if self.phase:
            self.phase_peaks[self.phase] = max(self.phase_peaks[self.phase], total)
        if total > self.peak_sum:
            self.peak_sum, self.at_peak, self.peak_time = total, dict(by_role), time.time()
            self.peak_phase = self.phase

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def figures(self) -> dict[str, Any]:
        """Peaks in GB: the sum, each role's own, and each role's share of the summed peak;
        when the peak was sampled (clock time and seconds after the start), and with phases
        set, the phase it fell in and each phase's summed peak."""
        found = {
            "peak_rss_gb": round(self.peak_sum / GB, 2),
            "peak_rss_gb_by_role": {k: round(v / GB, 2) for k, v in sorted(self.peaks.items())},
            "rss_gb_at_peak": {k: round(v / GB, 2) for k, v in sorted(self.at_peak.items())},
            "peak_at": time.strftime("%H:%M:%S", time.localtime(self.peak_time)),
            "peak_s_after_start": round(self.peak_time - self.started, 1),
        }
        if self.phase_peaks:
            found["peak_phase"] = self.peak_phase
            found["peak_rss_gb_by_phase"] = {k: round(v / GB, 2)
                                             for k, v in self.phase_peaks.items()}
        return found
