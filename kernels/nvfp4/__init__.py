"""The NVFP4 GEMM family: the block-scaled GEMM shell and its torch entry, the quantize and
amax kernels, the rcp.approx probe. Shells compose producers/, consumers/, epilogues/."""
