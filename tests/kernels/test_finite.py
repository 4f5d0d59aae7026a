"""kernels/finite.py `flag_nonfinite` equals its torch reference: NaN, +-Inf and clean buffers of each float dtype,
the bad value first, last, in the masked tail's block or absent, and a flag already raised stays raised (on CUDA
where a GPU exists, else under the interpreter)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.finite import BLOCK, flag_nonfinite, reference
from tests.devices import KERNEL_DEVICE

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
N = 2 * BLOCK + 37  # three programs, the last one mostly masked


def _flag(x: torch.Tensor, start: int = 0) -> int:
    flag = torch.full((1,), start, dtype=torch.int32, device=x.device)
    flag_nonfinite(x, flag)
    return int(flag.item())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), None])
@pytest.mark.parametrize("where", [0, BLOCK - 1, N - 1])
def test_flag_equals_reference(dtype, value, where):
    g = torch.Generator().manual_seed(where)
    x = (torch.randn(N, generator=g) * 100).to(dtype)
    x[1] = torch.finfo(dtype).max  # the largest finite values are not flagged
    x[2] = -torch.finfo(dtype).max
    x[3] = torch.finfo(dtype).tiny / 4  # nor subnormals
    if value is not None:
        x[where] = value
    x = x.to(KERNEL_DEVICE)
    assert _flag(x) == reference(x) == (value is not None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_raised_flag_stays_and_bad_input_refused(dtype):
    x = torch.zeros(100, dtype=dtype, device=KERNEL_DEVICE)
    assert _flag(x) == 0 and _flag(x, start=1) == 1
    assert _flag(x[:0]) == 0
    with pytest.raises(ValueError, match="1-D contiguous"):
        flag_nonfinite(x.view(10, 10), torch.zeros(1, dtype=torch.int32, device=KERNEL_DEVICE))
    with pytest.raises(ValueError, match="one int32"):
        flag_nonfinite(x, torch.zeros(1, dtype=torch.int64, device=KERNEL_DEVICE))
    with pytest.raises(ValueError, match="not a float16"):
        flag_nonfinite(x.to(torch.int32), torch.zeros(1, dtype=torch.int32, device=KERNEL_DEVICE))
