"""CPU seconds per Dagster step of a run, beside its wall seconds.

The project's runs execute every step in the run's own process (``in_process_executor``), so a
step's CPU is what that process spent between the step's start and its end: the harness samples
the user + system CPU of the command's process tree (every thread's, DuckDB's included, and the
run's process where a wrapper started it) every ~50 ms
(``harness.measure``), and the step boundaries come from the run's event log in its
``DAGSTER_HOME`` (``STEP_START`` and ``STEP_SUCCESS``/``STEP_FAILURE``, at sub-millisecond
resolution). The CPU at a boundary is interpolated between the two samples around it. Wall time
on a shared machine is noise; CPU is what a change saves.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

#: (epoch seconds, user + system CPU seconds of the sampled process) pairs, in time order.
CpuSamples = list[tuple[float, float]]


@dataclass(frozen=True)
class StepCpu:
    step: str
    wall_s: float
    cpu_s: float
    #: The process tree's largest RSS sampled while the step ran (0 without samples).
    peak_rss: int = 0


def cpu_at(samples: CpuSamples, when: float) -> float:
    """The process's CPU seconds at ``when``, interpolated between the samples around it."""
    if not samples:
        return float("nan")
    times = [t for t, _ in samples]
    i = bisect.bisect_left(times, when)
    if i == 0:
        return samples[0][1]
    if i >= len(samples):
        return samples[-1][1]
    (t0, c0), (t1, c1) = samples[i - 1], samples[i]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)


def step_bounds(home: Path) -> list[tuple[str, float, float]]:
    """(step key, start epoch, end epoch) of every step of the latest run in ``home``."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs(limit=1)
        if not runs:
            return []
        started: dict[str, float] = {}
        bounds: list[tuple[str, float, float]] = []
        for entry in instance.all_logs(runs[0].run_id):
            event = entry.dagster_event
            if event is None or entry.step_key is None:
                continue
            if event.event_type_value == "STEP_START":
                started[entry.step_key] = entry.timestamp
            elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE"):
                start = started.pop(entry.step_key, None)
                if start is not None:
                    bounds.append((entry.step_key, start, entry.timestamp))
    return bounds


def step_cpu(
    home: Path, samples: CpuSamples, rss: list[tuple[float, int]] | None = None
) -> list[StepCpu]:
    """Wall and CPU seconds of each step of the latest run in ``home``, in the order they ran,
    and the peak of ``rss`` ((epoch, bytes) samples) while each ran."""
    return [
        StepCpu(
            step,
            end - start,
            cpu_at(samples, end) - cpu_at(samples, start),
            max((b for t, b in rss or () if start <= t <= end), default=0),
        )
        for step, start, end in step_bounds(home)
    ]
