"""GPU benchmarks and profilers, run from the repository root as `python -m benchmarks.NAME`.

Current numbers: benchmarks/RESULTS.md; every earlier measurement and decision: benchmarks/HISTORY.md; raw
reports: benchmarks/results/. Shared timing and report helpers: benchmarks/timing.py.
"""
