"""Node blocks without METIS: equal runs of the reverse Cuthill-McKee order.

:func:`~fullgraph.partition.blocks.node_blocks` cuts its blocks along METIS bisections; on a
machine where neither libmetis nor pymetis can be imported (``auto``'s fallback, with a note)
or when asked (``metis="rcm"``) it takes :func:`rcm_blocks` instead: a worse cut, but a
deterministic function of the CSR, so the blocks (and the bit-identical contract they carry)
are the same at any rank count.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

from fullgraph.datasets.graph import Graph
from fullgraph.partition.assign import symmetric_adjacency


def rcm_blocks(graph: Graph, num_blocks: int) -> np.ndarray:
    """Every node's block, int64 [N]: ``min(num_blocks, N)`` blocks of equal node counts
    (to one; none empty) along the reverse Cuthill-McKee order of the symmetric adjacency
    (a bandwidth-reducing order: consecutive nodes lie near each other in the graph)."""
    # here, not at the top: scipy.sparse.csgraph brings scipy.sparse.linalg (45 modules),
    # which a training rank imports this module without ever using (docs/scale.md, the floor)
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    n = graph.num_nodes
    xadj, adjncy = symmetric_adjacency(graph)
    adjacency = csr_matrix((np.ones(adjncy.size, np.int8), adjncy, xadj), shape=(n, n))
    order = np.asarray(reverse_cuthill_mckee(adjacency, symmetric_mode=True), dtype=np.int64)
    block = np.empty(n, dtype=np.int64)
    count = min(int(num_blocks), n)
    block[order] = (np.arange(n, dtype=np.int64) * count) // max(n, 1)
    return block
