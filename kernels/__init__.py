"""fullgraph.kernels: the sparse aggregation operator and the halo compression kernels.

Public API:
    - :class:`CSRMatrix`: a CSR operator built once per graph (transpose cached, GCN / mean
      weights).
    - :func:`spmm`: ``A @ X``, autograd-aware; Triton on CUDA, numba on CPU, torch reference.
    - :func:`spmm_reference`: the plain-torch ``A @ X``.
    - :func:`spmm_add_`: ``out += A @ X`` in place (the halo product), no autograd.
    - :func:`spmm_exact`: ``A @ X`` of bfloat16 rows summed in float64 (bf16-mixed training).
    - :func:`quantize`, :func:`dequantize`, :class:`QuantizedRows`, :func:`cast_half`:
      per-row min/scale quantization to 8, 4 or 2 bits, packed into bytes.
    - :func:`segment_max`, :class:`SegmentMax`: the maximum over every CSR row's entries per
      column, ties to the lowest key (global node id), its gradient to the one argmax row.

GAT's attention over a rank's in-edges (edge softmax, hashed attention dropout, weighted sum;
numba on CPU, torch elsewhere) is :func:`fullgraph.kernels.edge_attention.edge_attention`, over
an :class:`~fullgraph.kernels.attention_graph.AttentionGraph` with the mask of
:mod:`fullgraph.kernels.attention_dropout`; the layer imports them from there.
"""

from fullgraph.kernels.csr import CSRMatrix
from fullgraph.kernels.quantize import (
    cast_half,
    dequantize,
    dequantize_bytes,
    quantize,
    quantize_to_bytes,
)
from fullgraph.kernels.quantized_rows import QuantizedRows, packed_width, record_nbytes
from fullgraph.kernels.segment_max import SegmentMax, segment_max
from fullgraph.kernels.spmm import spmm, spmm_add_, spmm_exact, spmm_reference

__all__ = [
    "CSRMatrix",
    "QuantizedRows",
    "SegmentMax",
    "cast_half",
    "dequantize",
    "dequantize_bytes",
    "packed_width",
    "quantize",
    "quantize_to_bytes",
    "record_nbytes",
    "segment_max",
    "spmm",
    "spmm_add_",
    "spmm_exact",
    "spmm_reference",
]
