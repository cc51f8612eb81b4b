"""The memory rule every run start applies: predicted peaks per node against its memory.

:class:`StartupPlan` is ``fullgraph train``'s plan: before it allocates anything by the model's
sizes it predicts every rank's peak (:mod:`fullgraph.memory.model`) and refuses a launch with a
node that would not fit, exit status 2, unless ``--memory-check warn`` (or ``off``) says
otherwise; it prints rank 0's line of the table at start. :func:`check_minibatch` is the same
rule for ``fullgraph minibatch``; ``fullgraph plan`` (:mod:`fullgraph.commands.plan`) prints
the whole table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fullgraph.errors import ConfigError
from fullgraph.memory.model import (
    TERMS,
    GraphShape,
    Prediction,
    check_modelled,
    current_rss_bytes,
    measure_floor,
    predict_quickly,
)
from fullgraph.resources import file_backed_rss_bytes
from fullgraph.training.config import TrainConfig

if TYPE_CHECKING:
    from fullgraph.datasets import Graph
    from fullgraph.minibatch.config import MinibatchConfig

MIB, GIB = 2**20, 2**30


def machine_memory_bytes() -> int:
    """This machine's memory, bytes: ``MemTotal`` of ``/proc/meminfo``, or this process's
    control group's limit when lower (:func:`fullgraph.resources.node_memory_bytes`)."""
    from fullgraph.resources import node_memory_bytes

    return node_memory_bytes()


@dataclass
class NodeFit:
    """The ranks of one node and whether their predicted peaks fit its memory."""

    node: int
    ranks: list[int]
    need: int
    have: int
    shared: int = 0

    @property
    def fits(self) -> bool:
        """Whether the predicted peaks add up to at most the node's memory."""
        return self.need <= self.have


def node_fits(
    preds: list[Prediction], ranks_per_node: int, node_memory: int, shared: int = 0
) -> list[NodeFit]:
    """Consecutive ``ranks_per_node`` ranks per node (mpirun's default placement).

    ``shared``: the file-backed part of the process floor (the libraries' code, one copy in
    the node's page cache whatever the number of ranks mapping it), counted once per node
    instead of once per rank; 0 counts it in every rank (an upper bound)."""
    out = []
    for start in range(0, len(preds), ranks_per_node):
        group = preds[start : start + ranks_per_node]
        once = min([shared, *(p.terms.get("floor", p.total) for p in group)])
        out.append(
            NodeFit(
                node=start // ranks_per_node,
                ranks=[p.rank for p in group],
                need=sum(p.total for p in group) - max(0, len(group) - 1) * once,
                have=node_memory,
                shared=once if len(group) > 1 else 0,
            )
        )
    return out


def node_line(nf: NodeFit) -> str:
    """``node 0 (ranks 0-3): 3.14 GiB of 23.54 GiB: fits`` (and the libraries counted once)."""
    verdict = "fits" if nf.fits else "does NOT fit"
    once = f" (the libraries' {mib(nf.shared)} MiB once)" if nf.shared else ""
    return (
        f"node {nf.node} ({ranks_label(nf.ranks)}): {nf.need / 2**30:.2f} GiB{once} of "
        f"{nf.have / 2**30:.2f} GiB: {verdict}"
    )


def mib(nbytes: float) -> str:
    """Bytes as whole MiB, for tables and lines."""
    return f"{nbytes / MIB:.0f}"


def ranks_label(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-3``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


#: ``--memory-check`` (``fullgraph train`` and ``minibatch``): what a run does when the
#: predicted peak of a node's ranks exceeds its memory.
MEMORY_CHECKS = ("refuse", "warn", "off")


#: What a refusal of ``fullgraph train`` suggests.
TRAIN_ADVICE = (
    "use more ranks, fewer per node, a narrower model or halo compression (`fullgraph plan` "
    "shows every rank)"
)


#: What a refusal of ``fullgraph predict`` suggests.
PREDICT_ADVICE = (
    "use a partition of more parts, fewer ranks per node (`fullgraph plan --predict` shows "
    "every rank)"
)


#: What a refusal of ``fullgraph minibatch`` suggests.
MINIBATCH_ADVICE = (
    "use a narrower model (--hidden), more ranks or fewer per node (`fullgraph plan minibatch` "
    "shows every rank)"
)


def memory_verdict(fits: list[NodeFit], check: str, advice: str = TRAIN_ADVICE) -> list[str]:
    """Refuse (``check == "refuse"``) or warn about the nodes that would not fit.

    Returns:
        A ``warning:`` line per node that would not fit (``warn``), else none.

    Raises:
        ConfigError: ``refuse`` and a node would not fit: one line naming the node's predicted
            peak, its memory and the option that runs anyway.
    """
    bad = [nf for nf in fits if not nf.fits]
    if check == "refuse" and bad:
        worst = max(bad, key=lambda nf: nf.need - nf.have)
        raise ConfigError(
            f"memory plan: node {worst.node} ({ranks_label(worst.ranks)}) would need "
            f"{worst.need / GIB:.2f} GiB at the predicted peak, more than this machine's "
            f"{worst.have / GIB:.2f} GiB; {advice}, or --memory-check warn to run anyway"
        )
    return [
        f"warning: memory plan: node {nf.node} ({ranks_label(nf.ranks)}) would need "
        f"{nf.need / GIB:.2f} GiB of this machine's {nf.have / GIB:.2f} GiB"
        + (" (`fullgraph plan` shows every rank)" if advice == TRAIN_ADVICE else "")
        + (" (`fullgraph plan --predict` shows every rank)" if advice == PREDICT_ADVICE else "")
        + (" (`fullgraph plan minibatch` shows every rank)" if advice == MINIBATCH_ADVICE else "")
        for nf in bad
    ]


class StartupPlan:
    """``fullgraph train``'s memory plan, on rank 0: sizes checked before anything large.

    1. :meth:`check_sizes`, as soon as the graph's sizes are known (the partition's
       ``meta.json``; a one-process run's graph once loaded) and before anything that
       allocates by the model's sizes: the prediction (:func:`~fullgraph.
       memory.model.predict_quickly`, no tensor built) with this process's resident memory as
       the floor, a lower bound of the measured one. An absurd width, head or layer count
       (``--hidden 10000000``, ``--heads 100000``, ``--layers 100000``) ends here, in seconds,
       by the same rule as any run too large for its nodes: no caps.
    2. :meth:`measure_floor`: the floor probe (a two-epoch run of the same model on a 64-node
       graph, :func:`~fullgraph.memory.model.measure_floor`), skipped when step 1
       already found a node that does not fit.
    3. :meth:`report`: the prediction with the measured floor; rank 0's line, and the same
       refusal or warnings.

    ``check`` (``--memory-check``): ``refuse`` (the default; exit status 2), ``warn`` (a
    warning line, and the run goes on), ``off`` (no prediction, no probe). Every node is taken
    to have this machine's memory (:func:`machine_memory_bytes`), shared by
    ``ranks_per_node`` consecutive ranks.

    ``fullgraph predict`` applies steps 1 and 3 with ``mode="predict"`` (its own pass replayed,
    no probe: the floor stays this process's resident memory, a lower bound).

    Args:
        cfg: the run's configuration (predict: the model file's).
        check: one of :data:`MEMORY_CHECKS`.
        ranks_per_node: ranks on each node of the launch.
        mode: ``train`` or ``predict`` (:data:`~fullgraph.memory.model.MODES`).
    """

    def __init__(
        self, cfg: TrainConfig, check: str, ranks_per_node: int, mode: str = "train"
    ) -> None:
        self.cfg, self.check, self.per_node = cfg, check, max(1, ranks_per_node)
        self.mode = mode
        self.unmodelled = ""
        try:
            check_modelled(cfg)
        except ConfigError as exc:
            self.unmodelled = str(exc)
        #: this process before it loads anything: the floor's lower bound
        self.resident = current_rss_bytes()
        self.floor = self.resident
        #: the floor's file-backed part, counted once per node (measured with the floor)
        self.shared = 0
        self.fits = True

    @property
    def _advice(self) -> str:
        return PREDICT_ADVICE if self.mode == "predict" else TRAIN_ADVICE

    @property
    def active(self) -> bool:
        """Whether there is a prediction to make (checked, and the model covered)."""
        return self.check != "off" and not self.unmodelled

    def _fits(self, graph: GraphShape) -> tuple[list[Prediction], list[NodeFit]]:
        preds = predict_quickly(graph, self.cfg, self.floor, self.mode)
        fits = node_fits(preds, self.per_node, machine_memory_bytes(), self.shared)
        self.fits = all(nf.fits for nf in fits)
        return preds, fits

    def check_sizes(self, graph: GraphShape) -> None:
        """Step 1 (see the class docstring), before any probe (with ``warn`` the warnings come
        from :meth:`report`).

        Raises:
            ConfigError: ``refuse`` and a node would not fit.
        """
        if self.active:
            memory_verdict(self._fits(graph)[1], self.check, self._advice)

    def measure_floor(self, num_features: int, num_classes: int) -> None:
        """Step 2: the process floor, without what this process loaded since it started.

        The libraries' pages touched since the start (step 1's code) leave the resident set
        first: what the probe's epoch touches again is counted once, in ``after``.
        """
        from fullgraph.resources import drop_library_pages

        if not self.active or not self.fits:
            return
        drop_library_pages()
        before = current_rss_bytes()
        after = measure_floor(self.cfg, num_features, num_classes)
        self.floor = self.resident + max(0, after - before)
        self.shared = min(file_backed_rss_bytes(), self.floor)

    def report(self, graph: GraphShape) -> list[str]:
        """Step 3: rank 0's predicted peak, and the refusal or warnings.

        Returns:
            Lines to print: ``memory plan: ...`` and ``warning: ...`` lines (one line saying
            so when the model is not covered; none with ``--memory-check off``).

        Raises:
            ConfigError: ``refuse`` and a node would not fit.
        """
        if self.check == "off":
            return []
        if self.unmodelled:
            return [f"memory plan: none ({self.unmodelled})"]
        preds, fits = self._fits(graph)
        return [plan_line(preds[0]), *memory_verdict(fits, self.check, self._advice)]


def plan_line(pred: Prediction) -> str:
    """The start line of a rank's predicted peak (``train``, ``minibatch``): ``memory plan:
    rank 0 peak 413 MiB in setup (graph structure 1, ..., process floor 410 MiB)``."""
    terms = ", ".join(f"{TERMS[t]} {mib(v)}" for t, v in pred.terms.items() if v)
    return f"memory plan: rank {pred.rank} peak {mib(pred.total)} MiB in {pred.phase} ({terms} MiB)"


def check_minibatch(
    graph: Graph, cfg: MinibatchConfig, ranks: int, ranks_per_node: int, check: str
) -> list[str]:
    """``fullgraph minibatch``'s memory check, on rank 0 once the graph is loaded (memory-mapped)
    and before the model is built: the estimate of
    :func:`~fullgraph.memory.minibatch.predict_minibatch` (a lower bound) with
    this process's resident memory as the floor, against this machine's memory.

    Args:
        graph: the loaded :class:`~fullgraph.datasets.Graph`.
        cfg: the run's :class:`~fullgraph.minibatch.config.MinibatchConfig`.
        ranks: ranks of the run.
        ranks_per_node: ranks on each node.
        check: ``--memory-check`` (:data:`MEMORY_CHECKS`).

    Returns:
        Rank 0's ``memory plan:`` line (:func:`plan_line`) and a ``warning:`` line per node
        that would not fit (``warn``); none with ``off``.

    Raises:
        ConfigError: ``refuse`` and a node would not fit.
    """
    if check == "off":
        return []
    from fullgraph.memory.minibatch import predict_minibatch

    per_node = max(1, ranks_per_node)
    preds = predict_minibatch(
        graph.num_nodes,
        graph.num_edges,
        graph.num_features,
        graph.num_classes,
        cfg,
        ranks,
        per_node,
        current_rss_bytes(),
    )
    fits = node_fits(preds, per_node, machine_memory_bytes(), file_backed_rss_bytes())
    return [plan_line(preds[0]), *memory_verdict(fits, check, MINIBATCH_ADVICE)]
