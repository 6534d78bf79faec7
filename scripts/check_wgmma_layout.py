"""Which descriptor stride convention kernels/depth/gemm_skinny_wgmma.py needs, on the GPU: one
small projection with K-adjacent core matrices in LBO (the kernel's) and in SBO (swapped), each
against fp64. A diagnostic for a failing wgmma test (one line a convention)."""
import torch

from kernels.depth.gemm_skinny import _ptr_specs
from kernels.depth.gemm_skinny_wgmma import GemmSkinnyWgmma, chunk_major, pack_weights_wgmma
from device.runtime import cute_modules, current_stream, pointer_args
from device.waits import diagnostics_mailbox
from workbench.results import provenance_line

cutlass, cute = cute_modules()


def run(M: int, N: int, K: int, swap: bool):
    """Max |error| against fp64 and the count of unwritten (NaN) outputs."""
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    w = (0.03 * torch.randn(N, K, device="cuda", generator=g)).to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda")
    cfg = GemmSkinnyWgmma(M, K, out_f32=True, swap_strides=swap)
    wp, a_cm = pack_weights_wgmma(w), chunk_major(a)
    ptrs = pointer_args(_ptr_specs(True) + ((cutlass.Int32, 4),),
                        (a_cm, wp.data, out, a_cm, a_cm, diagnostics_mailbox()))
    n = cutlass.Int32(N)
    cute.compile(cfg, *ptrs, n, n, current_stream())(*ptrs, n, n, current_stream())
    torch.cuda.synchronize()
    err = (out.double() - a.double() @ w.double().T).abs().nan_to_num(float("inf")).max()
    return err.item(), int(torch.isnan(out).sum())


if __name__ == "__main__":
    print(provenance_line(), flush=True)
    for swap in (False, True):
        err, nans = run(64, 256, 1024, swap)
        print(f"K-adjacent core matrices in {'SBO' if swap else 'LBO'}: max |error| {err:.3e}, "
              f"{nans} outputs unwritten")
