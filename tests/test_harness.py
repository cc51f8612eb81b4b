"""The tests' own comparison (:func:`harness.assert_matches_one_process`): strict, and its
failure names the quantity, the run and the entry that differ."""

from __future__ import annotations

import numpy as np
import pytest
from harness import EXACT, Tol, assert_matches_one_process

WANT = {"gcn/logits": np.array([[1.0, 2.0], [3.0, 4.0]]), "gcn/losses": np.array([0.5, 0.25])}


def _got(**changes: np.ndarray) -> dict[str, np.ndarray]:
    return {**{k: v.copy() for k, v in WANT.items()}, **changes}


def test_equal_results_pass_and_each_tolerance_is_its_quantitys() -> None:
    assert_matches_one_process(
        _got(), WANT, {"logits": EXACT, "losses": EXACT}, names=["gcn"], where="P=2"
    )
    near = _got(**{"gcn/logits": WANT["gcn/logits"] + 1e-6})
    tolerances = {"logits": (0.0, 2e-6), "losses": EXACT}
    assert_matches_one_process(near, WANT, tolerances, names=["gcn"], where="P=2")
    with pytest.raises(AssertionError):
        assert_matches_one_process(near, WANT, {"logits": (0.0, 5e-7)}, names=["gcn"], where="P=2")


def test_the_failure_names_the_quantity_the_run_and_the_entry() -> None:
    got = _got(**{"gcn/logits": np.array([[1.0, 2.0], [3.0, 4.5]])})
    with pytest.raises(AssertionError) as info:
        assert_matches_one_process(
            got, WANT, {"logits": (1e-5, 1e-5), "losses": EXACT}, names=["gcn"], where="P=2, mpi"
        )
    msg = str(info.value)
    assert "P=2, mpi: 1 of 2 quantities differ from one process" in msg
    assert "gcn/logits: 1 of 4 entries differ to rtol=1e-05, atol=1e-05" in msg
    assert (
        "at [1, 1]: np.float64(4.5), one process np.float64(4.0)" in msg or "at [1, 1]: 4.5" in msg
    )
    assert "gcn/losses" not in msg


def test_shapes_missing_keys_and_nan_are_strict() -> None:
    short = _got(**{"gcn/losses": np.array([0.5])})
    with pytest.raises(AssertionError, match=r"gcn/losses: shape \(1,\), one process \(2,\)"):
        assert_matches_one_process(short, WANT, {"losses": (1.0, 1.0)}, names=["gcn"], where="P=2")
    with pytest.raises(AssertionError, match="sage/losses: missing from the P-rank result"):
        assert_matches_one_process(
            _got(),
            WANT | {"sage/losses": np.ones(2)},
            {"losses": EXACT},
            names=["gcn", "sage"],
            where="P=2",
        )
    nan = np.array([np.nan, 1.0])
    assert_matches_one_process(nan, nan.copy(), {"x": EXACT}, where="P=2")
    with pytest.raises(AssertionError, match="x: 1 of 2 entries differ to rtol=1, atol=1"):
        assert_matches_one_process(
            np.array([np.nan, 1.0]), np.array([0.0, 1.0]), {"x": (1.0, 1.0)}, where="P=2"
        )


def test_a_key_may_have_its_own_tolerance_and_atol_may_scale_with_the_largest_entry() -> None:
    got = _got(**{"gcn/losses": np.array([0.5, 0.2501])})
    assert_matches_one_process(
        got,
        WANT,
        {"losses": EXACT},
        names=["gcn"],
        where="P=2",
        tolerance_of={"gcn/losses": (0.0, 1e-3)},
    )
    big = np.array([1000.0, 0.0])
    assert_matches_one_process(
        big + [0, 5e-3], big, {"x": Tol(0.0, 1e-5, of_max=True)}, where="P=2"
    )
    with pytest.raises(AssertionError):
        assert_matches_one_process(big + [0, 5e-3], big, {"x": Tol(0.0, 1e-5)}, where="P=2")
