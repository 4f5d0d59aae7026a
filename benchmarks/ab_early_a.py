"""A/B (session 13, rejected): the shrink loads its first A tiles before the PDL wait (EARLY_A 1 or 2), and/or
prefetches its A lines into L2 (the <= 64-token PDL mode) at every size. Arms over ab_pool.compare."""
import sys
sys.path.insert(0, "benchmarks")
from ab_pool import compare, parser
from multilora_cli.kernels import sgmv_shrink
from multilora_cli.kernels.pdl import PdlMode

ORIG = sgmv_shrink.pdl_mode


def pf_mode(dev, t):
    m = ORIG(dev, t)
    return PdlMode(True, True) if m.launch else m


def arm(early, pf):
    def install():
        sgmv_shrink.EARLY_A = early
        sgmv_shrink.pdl_mode = pf_mode if pf else ORIG
    return install


ARMS = {"cur": (0, False), "e1": (1, False), "e2": (2, False), "pf": (0, True), "e1pf": (1, True)}
p = parser("early A", ",".join(ARMS))
args = p.parse_args()
compare({n: arm(*ARMS[n]) for n in args.arms.split(",")}, args)
