"""kernels/depth/rows_rmsnorm.py: RMSNorm of the rows into a bf16 buffer, bit for bit against a
reference that sums the squares in the kernel's order (tests/depth_helpers.py), and its
chunk-major output. The reference's order is checked on the CPU; the kernel needs the H200."""
import numpy as np
import pytest
import torch

from tests.depth_helpers import WARP, norm_weight, poison, randn_bf16, rms_norm_reference


def _replayed_sum_of_squares(row: np.ndarray, threads: int) -> np.float32:
    """normalize_chunks' (threads = 128) or the GEMV prologue's (32) sum of squares, scalar by
    scalar in IEEE fp32: thread j adds the squares of its chunks j, j + threads, ... (8
    elements each, in order), every lane then adds its butterfly partner's (offsets 16 .. 1),
    lane 0 of each warp publishes, and the warps' sums are added in order from 0."""
    K = row.size
    per_thread = []
    for t in range(threads):
        acc = np.float32(0)
        for i in range(K // (8 * threads)):
            for e in range(8):
                x = row[8 * (t + threads * i) + e]
                acc = np.float32(acc + x * x)
        per_thread.append(acc)
    tot = np.float32(0)
    for w in range(threads // WARP):
        lanes = per_thread[WARP * w: WARP * (w + 1)]
        for o in (16, 8, 4, 2, 1):
            lanes = [np.float32(lanes[lane] + lanes[lane ^ o]) for lane in range(WARP)]
        tot = np.float32(tot + lanes[0])
    return tot


@pytest.mark.parametrize("threads,K", [(128, 1024), (128, 2048), (WARP, 1024)])
def test_row_norm_reference_follows_the_kernels_order(threads, K):
    """tests/depth_helpers.rms_norm_reference against the kernels' loops replayed scalar by
    scalar (the same rsqrt applied to the replayed sum, then bf16(gamma · bf16(x · r))): the
    same bits."""
    g = torch.Generator().manual_seed(K + threads)
    M, eps = 3, 1e-6
    x, gamma = randn_bf16(M, K, g=g, scale=3.0, device="cpu"), norm_weight(K, g, device="cpu")
    got = rms_norm_reference(x, gamma, eps, threads)
    for m in range(M):
        tot = _replayed_sum_of_squares(x[m].float().numpy(), threads)
        v = np.float32(np.float32(tot * np.float32(1.0 / K)) + np.float32(eps))
        r = torch.rsqrt(torch.tensor(v))
        y = (x[m].float() * r).to(torch.bfloat16).float()
        assert torch.equal(got[m], (gamma.float() * y).to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [pytest.param(16, marks=pytest.mark.fast), 48, 128])
def test_rows_rmsnorm_is_bit_exact(M):
    """Every row against rms_norm_reference (128 threads a row), bit for bit, every element
    written (poisoned first)."""
    from kernels.depth.rows_rmsnorm import rows_rmsnorm

    g = torch.Generator(device="cuda").manual_seed(M)
    x = randn_bf16(M, 1024, g=g, scale=3.0)
    gamma = norm_weight(1024, g)
    out = rows_rmsnorm(x, gamma, poison(M, 1024))
    assert torch.equal(out, rms_norm_reference(x, gamma, 1e-6, 128))


@pytest.mark.gpu
def test_rows_rmsnorm_chunk_major_is_the_row_major_permuted():
    """``chunk_major``: the same bits as row-major, laid out [K / 8][M][8] (chunk_major())."""
    from kernels.depth.gemm_skinny_wgmma import chunk_major
    from kernels.depth.rows_rmsnorm import rows_rmsnorm

    g = torch.Generator(device="cuda").manual_seed(11)
    M, K = 32, 1024
    x, gamma = randn_bf16(M, K, g=g), norm_weight(K, g)
    row = rows_rmsnorm(x, gamma, poison(M, K))
    assert torch.equal(rows_rmsnorm(x, gamma, poison(M, K), chunk_major=True), chunk_major(row))
