"""Device helpers every kernel family uses: launch and compile helpers (runtime), bounded
waits and the trap mailbox (waits), PTX wrappers (ptx), the one set of device rounding rules
(rounding) and the NVFP4 codec (nvfp4). Helpers import nothing from the kernel families."""
