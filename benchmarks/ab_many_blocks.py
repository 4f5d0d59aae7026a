"""A/B (session 15): blocks for 129-256-token steps when the pool holds many adapters (sweeps 3-4 at 64 adapters:
qkv expand 2 x 256 columns on 2 warps; shrinks: qkv split 4, gate_up bk 64 / 4 stages, o and down 3 stages)."""
import sys
sys.path.insert(0, "benchmarks")
from ab_pool import compare, parser  # noqa: E402
from multilora_cli.kernels import blocks as B, sgmv_expand, sgmv_shrink  # noqa: E402

E0, S0 = sgmv_expand.expand_blocks, sgmv_shrink.shrink_blocks


def exp_many(t, out, n_slices, max_rank, num_sms=132):
    if 128 < B.token_bucket(t) <= 256 and n_slices == 3:
        return B.ExpandBlocks(bm=16, bn=256, nb=2, num_warps=2, num_stages=1)
    return E0(t, out, n_slices, max_rank, num_sms)


def shr_many(t, in_f, n_slices, max_rank, num_sms=132):
    if 128 < B.token_bucket(t) <= 256:
        if n_slices == 3:
            return B.ShrinkBlocks(bm=16, bk=128, split=4, num_warps=4, num_stages=3)
        if n_slices == 2:
            return B.ShrinkBlocks(bm=16, bk=64, split=8, num_warps=2, num_stages=4)
        return B.ShrinkBlocks(bm=16, bk=128, split=8, num_warps=2, num_stages=3)
    return S0(t, in_f, n_slices, max_rank, num_sms)


def arm(e, s):
    def install():
        sgmv_expand.expand_blocks = exp_many if e else E0
        sgmv_shrink.shrink_blocks = shr_many if s else S0
    return install


ARMS = {"cur": (0, 0), "exp": (1, 0), "shr": (0, 1), "both": (1, 1)}
p = parser("many-adapter blocks at 129-256 tokens", ",".join(ARMS))
args = p.parse_args()
compare({n: arm(*ARMS[n]) for n in args.arms.split(",")}, args)
