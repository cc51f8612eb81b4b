"""The plan of a link step (``fullgraph plan --task link``): the pairs' rows and gradients
and an evaluation's scored chunk on top of the encoder's replay, growing with the rank's
training edges and shrinking with ``--link-batch``; the measured peaks it was checked against
are in docs/link.md (collab-synth P = 4 and citation2-synth P = 8: 0.96-0.98x).

Enters through :mod:`fullgraph.memory.replay`.
"""

from __future__ import annotations

from dataclasses import replace

from fullgraph.memory.model import GraphShape, PartShape, _replay, predict
from fullgraph.training.config import TrainConfig

MIB = 2**20
FLOOR = 300 * MIB


def _shape(link_train: int, parts: int = 4) -> GraphShape:
    """A 200k-node graph in ``parts`` parts, each anchoring ``link_train`` training edges."""
    per = 200_000 // parts
    part = PartShape(0, per, per // 2, 10 * per, per // 2, 0, per, link_train=link_train)
    return GraphShape(
        "synthetic",
        parts,
        128,
        1,
        tuple([part] * parts),
        link_train_total=link_train * parts,
        link_eval_pairs=100_000,
    )


def _peak(shape: GraphShape, cfg: TrainConfig) -> int:
    return predict(shape, cfg, FLOOR)[0].total


def test_the_pairs_are_planned() -> None:
    cfg = TrainConfig(task="link", model="sage", layers=2, hidden=64, decoder="mlp")
    node = TrainConfig(model="sage", layers=2, hidden=64)
    shape = _shape(300_000)
    assert _peak(shape, cfg) > _peak(replace(shape, num_classes=64), node) + 100 * MIB
    assert _peak(_shape(600_000), cfg) > _peak(shape, cfg)  # more edges, more pairs
    batched = replace(cfg, link_batch=50_000)
    assert _peak(shape, batched) < _peak(shape, cfg)
    assert _replay(shape.parts[0], shape, cfg, FLOOR).peak_phase == "backward, link pairs"
    got = predict(shape, cfg, FLOOR)[0]
    assert got.total == sum(got.terms.values())
