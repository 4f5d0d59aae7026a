"""A/B (session 15): the shrink's A tiles and/or the one-block expand's B tiles loaded through TMA descriptors
(sgmv_shrink.TMA, sgmv_expand.TMA; rank-16 bucket only) instead of pointer loads. Arms over ab_pool.compare."""
import sys
sys.path.insert(0, "benchmarks")
from ab_pool import compare, parser  # noqa: E402
from multilora_cli.kernels import sgmv_expand, sgmv_shrink  # noqa: E402


def arm(shrink, expand):
    def install():
        sgmv_shrink.TMA, sgmv_expand.TMA = shrink, expand
    return install


ARMS = {"cur": (False, False), "tma_shrink": (True, False), "tma_expand": (False, True), "tma_both": (True, True)}
p = parser("A and B tiles through TMA descriptors", ",".join(ARMS))
args = p.parse_args()
compare({n: arm(*ARMS[n]) for n in args.arms.split(",")}, args)
