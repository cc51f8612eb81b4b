"""Worker of the exchange tests (``tests/distributed``): tasks run by :func:`harness.run_task`.

``compress --parts DIR --transports T...``: for every transport it checks, on every rank, and
saves (rank 0, ``.json``) the list of failures of all ranks plus a few figures:

- each codec: the halo rows delivered by the compressed exchange equal ``dequantize(quantize(
  rows sent))`` (computed here with the kernels API and delivered by the float32 exchange) in
  the right halo slots, and lie within one quantization step of the true rows; the gradients
  returned through the compressed backward equal the owners' sums of ``dequantize(quantize(
  halo gradients))``; the bytes booked are exactly ``rows x record bytes``; outside a training
  step the same plan sends float32;
- training: explicit ``none`` is bit-identical to the default config; compressed training is
  reproducible, its per-step halo bytes match the formula, its gradients are close to the
  float32 ones, evaluation exchanges float32, and the int2 + error-feedback loss falls.

``reduce --parts DIR --transports T...``: ``allreduce_`` sums of the :func:`reduce_input`
vectors of :data:`REDUCE_LENGTHS` lengths, and the parameters and losses after :data:`EPOCHS`
epochs of the default GCN (dropout on); saves (rank 0, ``.npz``) the results and the failures of
the checks every rank made (same bits on every rank, bytes booked).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import Tasks, communicators, main

CODECS = ("fp16", "bf16", "int8", "int4", "int2")
BITS = {"int8": 8, "int4": 4, "int2": 2}
WIDTH, SEED, EPOCH = 13, 5, 3


def _values(gids: torch.Tensor, salt: float) -> torch.Tensor:
    """Deterministic rows with different ranges per row: float32 [len(gids), WIDTH]."""
    cols = torch.arange(WIDTH, dtype=torch.float64)
    g = gids.to(torch.float64)[:, None]
    return (torch.sin(g * 0.7 + cols * 1.3 + salt) * (1 + g % 5)).to(torch.float32)


def _round_trip(codec: str, x: torch.Tensor, seed: int) -> torch.Tensor:
    from fullgraph.kernels import cast_half, dequantize, quantize

    if codec in BITS:
        return dequantize(quantize(x, BITS[codec], stochastic=True, seed=seed))
    return cast_half(x, codec).float()


def _step_bound(codec: str, x: torch.Tensor) -> torch.Tensor:
    """Largest error of one round trip of ``x`` (per row for the integer codecs)."""
    if codec in BITS:
        span = x.amax(1, keepdim=True) - x.amin(1, keepdim=True)
        return span / ((1 << BITS[codec]) - 1) * (1 + 1e-5) + 1e-6
    return x.abs() * (2**-8 if codec == "bf16" else 2**-11) + 1e-6


def check_exchange(part: Any, comm: Any, codec: str) -> list[str]:
    """One compressed forward + backward exchange against the kernels' round trip."""
    from fullgraph.distributed.compression import (
        BACKWARD,
        FORWARD,
        HaloCompression,
        exchange_seed,
        record_bytes,
    )
    from fullgraph.distributed.halo import HaloExchange, HaloPlan

    fails = []
    gids = torch.from_numpy(np.array(part.global_ids, dtype=np.int64))
    inner, halo_ids = gids[: part.num_inner], gids[part.num_inner :]
    plain = HaloPlan.from_partition(part, comm)
    plan = HaloPlan.from_partition(part, comm)
    plan.compression = HaloCompression(codec, codec, seed=SEED, rank=comm.rank)
    h = _values(inner, 0.0).requires_grad_(True)
    grad_out = _values(halo_ids, 1.0 + comm.rank)
    bytes0 = comm.bytes_sent["halo"]
    with plan.training_step(EPOCH):
        halo = HaloExchange.apply(h, plan)
        halo.backward(grad_out)
    booked = comm.bytes_sent["halo"] - bytes0
    rec = record_bytes(codec, WIDTH)
    peer_send = sum(plan.send_counts) - plan.send_counts[comm.rank]
    peer_recv = sum(plan.recv_counts) - plan.recv_counts[comm.rank]
    if booked != (peer_send + peer_recv) * rec:
        fails.append(f"{codec}: booked {booked} B, expected {(peer_send + peer_recv) * rec}")

    sent = h.detach()[plan.send_index]
    fwd_seed = exchange_seed(SEED, EPOCH, 0, FORWARD, comm.rank)
    want = plain.comm.alltoallv_start(
        _round_trip(codec, sent, fwd_seed), plan.send_counts, plan.recv_counts
    ).wait()
    truth = _values(halo_ids, 0.0)
    if not torch.equal(halo.detach(), want):
        fails.append(f"{codec}: halo rows differ from dequantize(quantize(sent rows))")
    if not bool(((halo.detach() - truth).abs() <= _step_bound(codec, truth)).all()):
        fails.append(f"{codec}: halo rows farther than one step from the true rows")
    if codec in BITS and halo.shape[0] and torch.equal(halo.detach(), truth):
        fails.append(f"{codec}: halo rows are exact, so nothing was quantized")

    bwd_seed = exchange_seed(SEED, EPOCH, 0, BACKWARD, comm.rank)
    returned = plain.start_backward(_round_trip(codec, grad_out, bwd_seed)).wait()
    want_grad = plain.scatter_back(torch.zeros_like(h.detach()), returned)
    exact_grad = plain.scatter_back(
        torch.zeros_like(h.detach()), plain.start_backward(grad_out).wait()
    )
    bound_rows = _step_bound(codec, grad_out).expand_as(grad_out).contiguous()
    bound = plain.scatter_back(
        torch.zeros_like(h.detach()), plain.start_backward(bound_rows).wait()
    )
    if not torch.equal(h.grad, want_grad):
        fails.append(f"{codec}: returned gradients differ from the owners' sums of round trips")
    if plan.send_index.numel() and not bool(h.grad.abs().sum() > 0):
        fails.append(f"{codec}: no gradient reached the boundary rows")
    if not bool(((h.grad - exact_grad).abs() <= bound * (1 + 1e-5) + 1e-5).all()):
        fails.append(f"{codec}: returned gradients farther than the summed steps from float32")

    evaluated = HaloExchange.apply(h.detach(), plan)  # outside a step: float32
    if not torch.equal(evaluated, truth):
        fails.append(f"{codec}: exchange outside a training step is not float32-exact")
    return fails


def _train(part: Any, comm: Any, epochs: int, **kw: Any) -> tuple[Any, list[float]]:
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    cfg = TrainConfig(
        model="gcn",
        layers=3,
        hidden=10,
        dropout=0.5,
        input_dropout=0.5,
        epochs=max(epochs, 1),
        seed=7,
        **kw,
    )
    tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
    return tr, [tr.train_step(e).loss for e in range(1, epochs + 1)]


def check_training(part: Any, comm: Any) -> tuple[list[str], dict[str, float]]:
    """Trainer-level checks (see the module docstring)."""
    from fullgraph.distributed.compression import record_bytes

    fails: list[str] = []
    figures: dict[str, float] = {}
    base, base_losses = _train(part, comm, 4)
    none, none_losses = _train(part, comm, 4, compress_fwd="none", compress_bwd="none")
    if base_losses != none_losses or not all(
        torch.equal(a, b)
        for a, b in zip(base.model.parameters(), none.model.parameters(), strict=True)
    ):
        fails.append("explicit none differs from the default config")

    ref, _ = _train(part, comm, 0)
    kw = {"compress_fwd": "int4", "compress_bwd": "int8", "error_feedback": True}
    comp, _ = _train(part, comm, 0, **kw)
    with torch.no_grad():  # evaluation exchanges float32: same logits as the float32 trainer
        same = torch.equal(comp.model(comp.data["x"], comp.ctx), ref.model(ref.data["x"], ref.ctx))
    if not same:
        fails.append("evaluation with compression configured is not float32-exact")
    ref.train_step(1)
    ref_grads = torch.cat([p.grad.reshape(-1) for p in ref.model.parameters()])
    bytes0 = comm.bytes_sent["halo"]
    comp.train_step(1)
    booked = comm.bytes_sent["halo"] - bytes0
    widths = [10, 10, 4]  # 12 -> 10 -> 10 -> 4, every layer transforms first
    want = 0
    for i, w in enumerate(widths):  # each layer's plan (receptive-field pruning narrows some)
        op, plan = comp.ctx.layer_graph(i, training=True)
        peer_send = sum(plan.send_counts) - plan.send_counts[comm.rank]
        # the backward sends the dY rows of boundary rows to their sources' owners
        rev = op.reverse(comm, plan.send_index, plan.send_counts, plan.recv_counts, plan.global_ids)
        rev_send = sum(rev.send_counts) - rev.send_counts[comm.rank]
        want += peer_send * record_bytes("int4", w) + rev_send * record_bytes("int8", w)
    if booked != want:
        fails.append(f"trainer step booked {booked} halo bytes, formula gives {want}")
    grads = torch.cat([p.grad.reshape(-1) for p in comp.model.parameters()])
    all_grads = comm.allgather_object(grads)
    cos = float(torch.nn.functional.cosine_similarity(grads, ref_grads, dim=0))
    figures["grad_cosine_int4_int8"] = cos
    if not all(torch.equal(g, all_grads[0]) for g in all_grads):
        fails.append("ranks hold different reduced gradients")
    if cos < 0.95:
        fails.append(f"compressed gradients far from float32 ones (cosine {cos:.3f})")

    _, again = _train(part, comm, 3, **kw)
    _, first = _train(part, comm, 3, **kw)
    if again != first:
        fails.append(f"compressed runs not reproducible: {first} vs {again}")
    _, int2 = _train(part, comm, 15, compress_fwd="int2", compress_bwd="int2", error_feedback=True)
    figures["int2_first_loss"], figures["int2_last_loss"] = int2[0], int2[-1]
    if not int2[-1] < 0.8 * int2[0]:
        fails.append(f"int2 + error feedback loss did not fall: {int2[0]:.4f} -> {int2[-1]:.4f}")
    return fails, figures


#: Epochs of the training in the ``reduce`` task.
EPOCHS = 20
#: Vector lengths of the ``reduce`` task (P is added: P - 1 and P + 1 give uneven chunks,
#: 1 leaves every rank but rank 0 an empty chunk).
REDUCE_LENGTHS = (1, 1000003)


def reduce_input(rank: int, n: int, dtype: Any = np.float32) -> np.ndarray:
    """Rank ``rank``'s contribution of length ``n``: magnitudes spread over 2^-30..2^30.

    The spread makes sums in different orders round differently, so that a result equal to
    the left-to-right sum bit for bit shows the order.
    """
    rng = np.random.default_rng([n, rank])
    scale = np.exp2(rng.integers(-30, 31, n).astype(np.float64))
    return (rng.standard_normal(n) * scale).astype(dtype)


def reduce_run(part: Any, comm: Any) -> tuple[dict[str, np.ndarray], list[str]]:
    """Sums of :func:`reduce_input` vectors and 20 epochs of training; with the failures.

    Returns:
        Results (rank 0's ``sum/N``, ``params``, ``losses``) and this rank's failed checks.
    """
    import hashlib

    from fullgraph.distributed.communicator import chunk_sizes
    from fullgraph.models.gnn import parameter_vector
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    out: dict[str, np.ndarray] = {}
    fails: list[str] = []
    lengths = sorted({*REDUCE_LENGTHS, comm.size - 1, comm.size + 1})
    for n in lengths:
        for dtype in (np.float32, np.float64):
            t = torch.from_numpy(reduce_input(comm.rank, n, dtype))
            before = comm.bytes_sent["test"]
            comm.allreduce_(t, "sum", tag="test")
            mine = chunk_sizes(n, comm.size)[comm.rank]
            want = (n - mine + (comm.size - 1) * mine) * t.element_size()
            if comm.bytes_sent["test"] - before != want:
                fails.append(f"n={n}: booked {comm.bytes_sent['test'] - before} B, not {want}")
            digests = comm.allgather_object(hashlib.sha256(t.numpy().tobytes()).hexdigest())
            if len(set(digests)) != 1:
                fails.append(f"n={n} {np.dtype(dtype).name}: ranks hold different sums")
            if dtype is np.float32:
                out[f"sum/{n}"] = t.numpy().copy()
    cfg = TrainConfig(model="gcn", epochs=EPOCHS, dropout=0.5, seed=3)
    tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
    tr.fit()
    params = parameter_vector(tr.model).detach()
    if len(set(comm.allgather_object(params.numpy().tobytes()))) != 1:
        fails.append("ranks hold different parameters after training")
    out["params"] = params.numpy().copy()
    out["losses"] = np.asarray(tr.history["losses"])
    comm.barrier()
    return out, fails


TASKS = Tasks()


@TASKS.task
def compress(*, parts: Path, transports: list[str]) -> dict[str, Any]:
    """:func:`check_exchange` of every codec and :func:`check_training` over each transport."""
    from fullgraph.partition import load_partition

    result: dict[str, Any] = {"failures": [], "figures": {}}
    for transport, comm in communicators(transports):
        part = load_partition(parts, comm.rank)
        fails = [f for codec in CODECS for f in check_exchange(part, comm, codec)]
        train_fails, figures = check_training(part, comm)
        for rank, got in enumerate(comm.allgather_object(fails + train_fails)):
            result["failures"] += [f"{transport} rank {rank}: {f}" for f in got]
        result["figures"].update({f"{transport}/{k}": v for k, v in figures.items()})
    return result


@TASKS.task
def reduce(*, parts: Path, transports: list[str]) -> dict[str, np.ndarray]:
    """:func:`reduce_run` over each transport, with every rank's failures."""
    from fullgraph.partition import load_partition

    result: dict[str, Any] = {}
    failures: list[str] = []
    for transport, comm in communicators(transports):
        part = load_partition(parts, comm.rank)
        got, fails = reduce_run(part, comm)
        for rank, theirs in enumerate(comm.allgather_object(fails)):
            failures += [f"{transport} rank {rank}: {f}" for f in theirs]
        result.update({f"{transport}/{k}": v for k, v in got.items()})
    result["failures"] = np.asarray(failures, dtype=str)
    return result


if __name__ == "__main__":
    sys.exit(main(TASKS))
