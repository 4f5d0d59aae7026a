"""A/B (session 14): the shrink prefetches the expand's B lines into L2 (sgmv_shrink.PREFETCH_B: 1 after its PDL
wait, 2 before it), so the expand that follows reads B from L2. Arms over ab_pool.compare."""
import sys
sys.path.insert(0, "benchmarks")
from ab_pool import compare, parser  # noqa: E402
from multilora_cli.kernels import sgmv_shrink  # noqa: E402


def arm(mode):
    def install():
        sgmv_shrink.PREFETCH_B = mode
    return install


ARMS = {"cur": 0, "pfb_after": 1, "pfb_before": 2}
p = parser("B prefetched by the shrink", ",".join(ARMS))
args = p.parse_args()
compare({n: arm(ARMS[n]) for n in args.arms.split(",")}, args)
