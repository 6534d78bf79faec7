"""CuTe DSL kernels by family: nvfp4/ (the NVFP4 GEMM family), depth/ (the depth loop) and
device/ (helpers every family uses). Imports point one way: families -> device, never back."""
