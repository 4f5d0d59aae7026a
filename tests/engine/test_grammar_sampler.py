"""The sampler with a grammar mask (engine/grammar/rows.GrammarMask): constrained rows draw only allowed tokens
(greedy: the argmax among them; sampled; with logit_bias processing on top), unconstrained rows draw exactly what
they draw without the mask, and the logits passed in are left as the model's (logprobs read them)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import SamplingParams
from multilora_cli.engine.grammar.rows import GrammarMask
from multilora_cli.engine.sampler import Sampler, SamplingBatch
from tests.devices import needs_interpreter
from tests.kernels.test_bitmask_interpret import pack

V = 300


@pytest.mark.parametrize("triton", [False, pytest.param(True, marks=needs_interpreter)])
def test_masked_rows_draw_allowed_tokens_only_and_free_rows_are_untouched(triton):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, V, generator=g) * 3
    raw = logits.clone()
    params = [
        SamplingParams(),  # greedy, masked
        SamplingParams(temperature=1.0),  # sampled, free
        SamplingParams(temperature=1.0, top_p=0.9),  # sampled, masked
        SamplingParams(),  # greedy, free
        SamplingParams(temperature=0.7, logit_bias={"7": 100}),  # processed, masked (7 is disallowed)
    ]
    allowed = torch.zeros(3, V, dtype=torch.bool)
    allowed[:, 40:50] = True
    allowed[0, 299] = True
    rows = torch.tensor([0, 2, 4])
    seeds, pos = [11, 12, 13, 14, 15], [3, 3, 3, 3, 3]
    free = Sampler(triton)(logits, SamplingBatch.build(params, seeds, pos, V))
    for trial in range(4):
        pos = [trial] * 5
        sb = SamplingBatch.build(params, seeds, pos, V)
        sb.grammar = GrammarMask(rows, pack(allowed))
        ids = Sampler(triton)(logits, sb)
        for k, r in enumerate(rows.tolist()):
            assert allowed[k, ids[r]], (r, ids[r])
        want = torch.where(allowed[0], logits[0], float("-inf")).argmax()
        assert ids[0] == want
        unmasked = Sampler(triton)(logits, SamplingBatch.build(params, seeds, pos, V))
        assert ids[1] == unmasked[1] and ids[3] == unmasked[3]
    assert torch.equal(logits, raw)
    assert free[3] == logits[3].argmax()
