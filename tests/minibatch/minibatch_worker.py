"""Worker of ``tests/minibatch/test_minibatch_mpi.py``: tasks run by :func:`harness.run_task`.

``gradient --root ROOT --transport T``: the first step's gradient of a mini-batch trainer on
``synth-tiny``; saves (rank 0, ``.npy``) the flat parameter gradients followed by the loss.

``inference --root ROOT --transport T``: layer-wise inference of a 3-layer SAGE model with the
rows broadcast in chunks of 37; saves (rank 0, ``.npz``) every rank's rows (``rank/R``) and the
one-process logits of the whole graph (``whole``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from harness import Tasks, main

TASKS = Tasks()


@TASKS.task
def gradient(*, root: Path, transport: str) -> np.ndarray:
    """Flat gradients of the first batch of epoch 1, then its loss (float64)."""
    from fullgraph.datasets import load
    from fullgraph.distributed import create_communicator
    from fullgraph.distributed.launch import detect_launch
    from fullgraph.minibatch.sampler import global_batches
    from fullgraph.minibatch.trainer import MinibatchConfig, MinibatchTrainer

    graph = load("synth-tiny", root)
    comm = create_communicator(transport, detect_launch(), timeout_s=60)
    cfg = MinibatchConfig(fanouts=[5, 3], batch_size=256, hidden=16, dropout=0.5, seed=3)
    trainer = MinibatchTrainer(graph, comm, cfg)
    batch = global_batches(trainer.train_nodes, cfg.batch_size, cfg.seed, 1)[0]
    loss, _ = trainer.gradient(1, 0, batch)
    flat = torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()])
    comm.barrier()
    comm.close()
    return np.append(flat.numpy().astype(np.float64), loss)


@TASKS.task
def inference(*, root: Path, transport: str) -> dict[str, np.ndarray]:
    """Each rank's rows of the logits, and the whole graph's on one process."""
    from fullgraph.datasets import load
    from fullgraph.distributed import create_communicator
    from fullgraph.distributed.communicator import Communicator
    from fullgraph.distributed.launch import detect_launch
    from fullgraph.minibatch.inference import RowOperator, layerwise_inference, row_range
    from fullgraph.models.gnn import GNN

    graph = load("synth-tiny", root, mmap=True)
    comm = create_communicator(transport, detect_launch(), timeout_s=60)
    torch.manual_seed(0)
    # 32 -> 48 aggregates first; 48 -> 8 and 8 -> 6 classes transform first
    model = GNN("sage", graph.num_features, 48, graph.num_classes, 3, 0.0, 0.0)
    model.layers[1] = GNN("sage", 48, 8, 8, 1, 0.0, 0.0).layers[0]
    model.layers[2] = GNN("sage", 8, 8, graph.num_classes, 1, 0.0, 0.0).layers[0]
    model.eval()
    n = graph.num_nodes
    lo, hi = row_range(n, comm.rank, comm.size)
    op = RowOperator.of(graph.indptr, graph.indices, lo, hi)
    mine = layerwise_inference(model, op, graph.x, comm, 37).numpy()
    out = {f"rank/{r}": rows for r, rows in enumerate(comm.allgather_object(mine))}
    if comm.rank == 0:
        whole = RowOperator.of(graph.indptr, graph.indices, 0, n)
        out["whole"] = layerwise_inference(model, whole, graph.x, Communicator()).numpy()
    comm.barrier()
    comm.close()
    return out


if __name__ == "__main__":
    sys.exit(main(TASKS))
