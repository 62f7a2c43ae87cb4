"""The `--weights gguf` LM head (helios.engine.model.head): bfloat16 scores pick the candidates,
float32 rescoring makes greedy's pick float32's."""

import torch
import torch.nn.functional as F
from torch import nn

from helios.engine.model.head import RescoredHead
from helios.engine.model.weights import Linear, bf16_available


class TorchBF16(nn.Module):
    """bf16(x) @ bf16(W).T in torch's own CPU matmul (float32 accumulation), where oneDNN's native
    bfloat16 linear is missing: the head's logic is the same whichever computes the scores."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight.to(torch.bfloat16)

    def forward(self, x):
        return F.linear(x.to(torch.bfloat16), self.weight)


def head_for(weight: torch.Tensor, **kw) -> RescoredHead:
    approx = Linear(weight, dtype=torch.bfloat16) if bf16_available() else TorchBF16(weight)
    return RescoredHead(weight, approx, **kw)


def test_the_bound_covers_the_bfloat16_error():
    torch.manual_seed(0)
    weight, x = torch.randn(512, 64) * 0.3, torch.randn(32, 64) * 5
    head = head_for(weight)
    rounded = x.to(torch.bfloat16)
    approx = head.approx(rounded).float()
    bound = head.bound(x, rounded.float(), approx)
    assert ((approx - x.double().matmul(weight.double().T).float()).abs() <= bound[:, None]).all()


def test_a_near_tie_that_bfloat16_rounds_away_is_decided_in_float32():
    # Two rows whose float32 logits differ by 0.004 around 25: bfloat16's step there is 0.125, so
    # both round to the same value and argmax takes the first, the float32 loser.
    torch.manual_seed(1)
    x = torch.randn(1, 64)
    x = x / x.norm() * 5
    direction = x[0] / x[0].norm()
    weight = torch.randn(256, 64) * 0.05
    weight[0] = direction * (25.000 / 5)
    weight[1] = direction * (25.004 / 5)
    head = head_for(weight)
    approx = head.approx(x.to(torch.bfloat16)).float()
    assert approx[0, 0] == approx[0, 1] and int(approx.argmax()) == 0  # the case bites
    y = head(x)
    exact = x @ weight.T
    assert int(y.argmax()) == int(exact.argmax()) == 1
    assert torch.allclose(y[0, :2], exact[0, :2], rtol=0, atol=1e-5)


def test_rescored_logits_are_float32_within_the_band_and_shapes_are_kept():
    torch.manual_seed(2)
    weight, x = torch.randn(1024, 64) * 0.4, torch.randn(3, 2, 64) * 4
    head = head_for(weight)
    y, exact = head(x), x @ weight.T
    assert y.shape == (3, 2, 1024)
    band = exact >= exact.amax(-1, keepdim=True) - head.margin
    assert torch.allclose(y[band], exact[band], rtol=1e-6, atol=1e-5)  # summation order
    assert (y.argmax(-1) == exact.argmax(-1)).all()


def test_too_many_candidates_fall_back_to_float32():
    torch.manual_seed(3)
    # Nearly equal rows: every token lies within greedy's 2E band, more than 8 per row.
    weight, x = 0.2 + torch.randn(512, 64) * 1e-4, torch.randn(2, 64)
    y = head_for(weight, max_candidates=8)(x)
    assert torch.allclose(y, x @ weight.T, rtol=0, atol=1e-5)


def test_a_wide_band_narrows_to_greedys_before_falling_back():
    torch.manual_seed(4)
    weight, x = torch.randn(2048, 64) * 0.05, torch.randn(1, 64) * 3
    weight[7] = x[0] / x[0].norm() * 2  # one clear winner, ~6 logits above a flat crowd
    head = head_for(weight, margin=100.0, max_candidates=64)  # the margin band holds every token
    y, exact = head(x), x @ weight.T
    assert int(y.argmax()) == int(exact.argmax()) == 7
    assert abs(float(y[0, 7] - exact[0, 7])) <= 1e-5
    assert not torch.equal(y, exact)  # the crowd kept its bfloat16 scores: no float32 fallback
