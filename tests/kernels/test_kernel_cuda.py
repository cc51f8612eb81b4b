"""The Triton kernels compiled for a GPU: spmm and quantize parity on CUDA tensors.

Skipped without CUDA (CI checks the same kernels under Triton's interpreter in
``test_spmm.py`` and ``test_quantize.py``); ``bench/gpu_check.sh`` runs this file.

Enters through :mod:`fullgraph.kernels.spmm_triton` and :mod:`fullgraph.kernels.quantize_triton`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fullgraph.kernels import CSRMatrix, dequantize, quantize, spmm

try:  # tests/ on sys.path (pytest's default "prepend" import mode)
    from test_spmm import TOLERANCES, dense_reference, make_case
except ImportError:  # tests/ as a package
    from tests.test_spmm import TOLERANCES, dense_reference, make_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _automatic_backend(monkeypatch):
    monkeypatch.delenv("FULLGRAPH_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize(
    "case", ["random", "unweighted", "empty_rows", "no_nnz", "rectangular", "hub"]
)
@pytest.mark.parametrize("width", [1, 3, 17, 128, 300])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_spmm_cuda_parity(case, width, index_dtype, dtype):
    indptr, indices, values, n_rows, n_cols = make_case(case, index_dtype, "cuda")
    A = CSRMatrix(indptr, indices, values, num_cols=n_cols).to("cuda")
    D = dense_reference(indptr, indices, values, n_rows, n_cols)
    X = torch.randn(n_cols, width, device="cuda").to(dtype)
    G = torch.randn(width, n_rows, device="cuda").to(dtype).t()  # non-contiguous upstream grad
    atol, rtol = TOLERANCES[dtype]
    if case == "hub":
        atol, rtol = atol * 100, rtol * 100
    Xg = X.detach().requires_grad_(True)
    Y = spmm(A, Xg)
    assert Y.device.type == "cuda" and Y.dtype == dtype
    torch.testing.assert_close(Y.double().cpu(), D @ X.double().cpu(), atol=atol, rtol=rtol)
    Y.backward(G)
    ref = D.t() @ G.double().cpu()
    torch.testing.assert_close(Xg.grad.double().cpu(), ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("width", [1, 3, 17, 130, 1000])
def test_quantize_cuda_matches_cpu(monkeypatch, bits, stochastic, width):
    X = torch.randn(257, width) * 4
    gpu = quantize(X.cuda(), bits, stochastic=stochastic, seed=99)
    monkeypatch.setenv("FULLGRAPH_KERNEL", "cpu")
    cpu = quantize(X, bits, stochastic=stochastic, seed=99)
    torch.testing.assert_close(gpu.row_min.cpu(), cpu.row_min)
    torch.testing.assert_close(gpu.row_scale.cpu(), cpu.row_scale)
    # Fused multiply-adds on the GPU may move a value across a rounding boundary: allow a few
    # codes to differ by one step, nothing more.
    deq_gpu, deq_cpu = dequantize(gpu).cpu(), dequantize(cpu)
    step = cpu.row_scale[:, None] * (1 + 1e-4) + 1e-6
    assert bool(((deq_gpu - deq_cpu).abs() <= step).all())
    assert float((gpu.packed.cpu() != cpu.packed).float().mean()) < 1e-3
