"""LinearFit's update in Python floats against the numpy update it replaced (the decayed sums as one
(n, n + 2) array, ``sums = sums * d + outer(x, [x, y, 1])``): the same sums bit for bit, hence the
same coefficients, through warm-up, outlier restarts and clipping."""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec.generation.cost_model import CostModel, LinearFit


class NumpyFit:
    """The reference: LinearFit.add as it was, on a numpy array."""

    def __init__(self, n: int, decay: float, warmup: int = 0) -> None:
        self.n, self.decay, self.warmup = n, decay, warmup
        self.sums = np.zeros((n, n + 2))
        self.count, self.sum_y, self.floor = 0.0, 0.0, float("inf")

    def add(self, x: np.ndarray, y: float, coef) -> None:
        if self.warmup > 0:
            self.warmup -= 1
            return
        if self.count > 0 and y * LinearFit.OUTLIER < self.floor:
            self.sums[:, : self.n + 1] = 0.0
            self.count, self.sum_y = 0.0, 0.0
        self.floor = min(y, self.floor / self.decay)
        if y > LinearFit.OUTLIER * max(self.floor, 1e-6):
            return
        if self.count >= 3.0 and y > 2.0 * self.sum_y / self.count:
            y = min(y, LinearFit.CLIP * max(float(x @ coef()), 1e-6))
        self.sums *= self.decay
        self.sums += np.multiply.outer(x, np.append(x, (y, 1.0)))
        self.count = self.count * self.decay + 1.0
        self.sum_y = self.sum_y * self.decay + y


@pytest.mark.parametrize("n,warmup,seed", [(3, 0, 0), (2, 1, 1), (2, 0, 2), (3, 1, 3)])
def test_python_float_update_equals_the_numpy_update(n, warmup, seed):
    rng = np.random.default_rng(seed)
    fit, ref = LinearFit(n, 0.98, warmup), NumpyFit(n, 0.98, warmup)
    for i in range(400):
        x = np.concatenate([[1.0], rng.integers(1, 9, n - 1).astype(np.float64)])
        y = float(x @ np.linspace(0.01, 0.02, n)) * rng.lognormal(0.0, 0.2)
        if i % 97 == 50:
            y *= 40.0     # a stall: dropped (above OUTLIER x the floor)
        if i % 131 == 70:
            y *= 3.0      # large: clipped against the prediction
        if i == 300:
            y /= 60.0     # below floor / OUTLIER: the fit restarts
        ref.add(x, y, lambda: fit.coef())   # (clipping reads the fit before this measurement)
        fit.add(tuple(float(v) for v in x), y)
        assert fit._s == ref.sums.ravel().tolist(), i    # bit for bit
        assert (fit.count, fit.sum_y, fit.floor) == (ref.count, ref.sum_y, ref.floor), i
    np.testing.assert_array_equal(fit.xtx, ref.sums[:, :n])
    np.testing.assert_array_equal(fit.xty, ref.sums[:, n])
    np.testing.assert_array_equal(fit.sum_x, ref.sums[:, n + 1])
    assert fit.sum_x0() == ref.sums[0, n + 1]


def test_a_saved_fit_loads_into_the_float_sums():
    m = CostModel(decay=0.98)
    for k in range(1, 6):
        m.record_draft("d", k, 1 + k % 3, 0.002 * (k + 1))
        m.record_decode(k, 1, 0.03 + 0.01 * k)
    again = CostModel.from_dict(m.to_dict())
    np.testing.assert_allclose(again.draft_cost("d", np.arange(5)), m.draft_cost("d", np.arange(5)), rtol=1e-9)
    np.testing.assert_allclose(again.verify_line.coef(), m.verify_line.coef(), rtol=1e-9)
    again.record_decode(2, 1, 0.05)   # and goes on from them
    assert again.verify_line.count > 0 and again.verify_line._np is None
