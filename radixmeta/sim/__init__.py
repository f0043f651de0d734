"""The simulator: workloads, workers, the event engine, metrics and reports.

See ``docs/simulator.md``. Workloads are in :mod:`radixmeta.sim.workloads`.
"""
