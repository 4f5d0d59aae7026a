"""End-to-end benchmark: multilora (with adapters / base only) vs HF transformers + PEFT vs the decode roofline.

Random-weight models of real shapes (`load_format="dummy"`), synthetic rank-r adapters on all seven
projections, N requests of fixed prompt/output length spread over the adapters (uniform or zipf). Used by
`python -m benchmarks.bench_e2e` and `multilora bench`; no CLI libraries are imported here.
"""

from multilora_cli.bench.suite import BenchRow, run_hf_row, run_multilora_row, run_suite
from multilora_cli.bench.workload import Workload

__all__ = ["BenchRow", "Workload", "run_hf_row", "run_multilora_row", "run_suite"]
