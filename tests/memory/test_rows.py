"""The memory model of the per-row kinds (:mod:`fullgraph.memory.rows`): ``mlp`` and
``appnp``.

- the terms add up, for float32 and bf16-mixed, training and predict, 1 and 4 ranks;
- ``mlp`` holds no operator and no edge structure: its structure term does not grow with the
  edges, and it has no halo buffers;
- ``appnp``'s propagation keeps nothing for the backward pass: its saved activations are the
  MLP's, at K = 1 and K = 10 alike; its temporaries do not grow with K (from K = 2: ``Z_(k-1)``
  beside ``H``); it holds GCN's operator (unpruned); error feedback keeps one residual per
  propagation step and direction.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fullgraph.memory.model import GraphShape, PartShape, _replay, predict
from fullgraph.training.config import TrainConfig

MIB = 2**20
FLOOR = 300 * MIB


def _shape(num_parts: int, n: int = 100_000, deg: int = 20) -> GraphShape:
    """``n`` nodes split evenly, half a part's rows as halo rows (47 classes)."""
    per = n // num_parts
    h = 0 if num_parts == 1 else per // 2
    part = PartShape(0, per, h, deg * per, h, per // 10, deg * h // 4)
    return GraphShape("synthetic", num_parts, 100, 47, tuple([part] * num_parts))


def _loss_terms(shape: GraphShape, cfg: TrainConfig) -> dict[str, int]:
    """The terms at the loss (every saved activation live)."""
    return _replay(shape.parts[0], shape, cfg, FLOOR).phase_peaks["loss"][1]


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
@pytest.mark.parametrize("ranks", [1, 4])
@pytest.mark.parametrize("mode", ["train", "predict"])
def test_terms_add_up(precision: str, ranks: int, mode: str) -> None:
    for model in ("mlp", "appnp"):
        cfg = TrainConfig(model=model, layers=3, hidden=64, precision=precision, norm="layer")
        got = predict(_shape(ranks), cfg, FLOOR, mode)[0]
        assert got.total == sum(got.terms.values()) and got.terms["floor"] == FLOOR


def test_mlp_holds_no_operator_and_exchanges_nothing() -> None:
    cfg = TrainConfig(model="mlp", layers=3, hidden=64)
    sparse = predict(_shape(4), cfg, FLOOR)[0]
    assert sparse.terms["halo"] == 0
    # nothing per edge is kept once the part is loaded (the set-up reads its edges)
    assert (
        _loss_terms(_shape(4), cfg)["structure"] == _loss_terms(_shape(4, deg=80), cfg)["structure"]
    )
    gcn = predict(_shape(4), replace(cfg, model="gcn"), FLOOR)[0]
    assert sparse.terms["structure"] < gcn.terms["structure"] / 10


def test_appnp_keeps_no_activation_of_its_propagation() -> None:
    shape = _shape(4)
    n, c = shape.parts[0].num_inner, shape.num_classes
    # every row in training, as appnp's (its propagation reads them all)
    mlp = TrainConfig(model="mlp", layers=2, hidden=64, dropout=0.5, prune="off")
    one, ten = replace(mlp, model="appnp", hops=1), replace(mlp, model="appnp", hops=10)
    assert _loss_terms(shape, one)["saved"] == _loss_terms(shape, mlp)["saved"]
    assert _loss_terms(shape, ten)["saved"] == _loss_terms(shape, mlp)["saved"]
    p1, p10 = predict(shape, one, FLOOR)[0], predict(shape, ten, FLOOR)[0]
    p2 = predict(shape, replace(ten, hops=2), FLOOR)[0]
    assert p2.total == p10.total  # K steps, the same buffers (Z_(k-1) beside H from K = 2)
    assert p10.total - p1.total == 4 * n * c
    # the propagation's temporaries beside the logits: at most 4 n C floats and the exchange
    assert p10.terms["working"] <= 4 * 6 * n * max(c, 64)
    # GCN's operator (its self-loops), unlike mlp's none
    gcn = predict(shape, replace(mlp, model="gcn", prune="off"), FLOOR)[0]
    assert p10.terms["structure"] == gcn.terms["structure"]


def test_appnp_error_feedback_keeps_a_residual_per_step() -> None:
    shape = _shape(4)
    p, c = shape.parts[0], shape.num_classes
    cfg = TrainConfig(
        model="appnp", hops=5, compress_fwd="int8", compress_bwd="int8", error_feedback=True
    )
    got = predict(shape, cfg, FLOOR)[0]
    assert got.terms["compression"] == 5 * 4 * c * (p.num_send + p.num_halo)
