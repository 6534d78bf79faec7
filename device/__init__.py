"""Device helpers every kernel family uses, on the ground floor: launch and compile helpers
(runtime), the TVM-FFI host path (ffi), bounded waits and the trap mailbox (waits), the barrier
and mailbox ids (barriers), the persistent tile loop (tiles), wgmma helpers (wgmma), PTX wrappers
and the PDL wrappers with their timing-perturbation build (ptx), the one set of device rounding
rules (rounding) and the NVFP4 codec (nvfp4). Helpers import nothing from the floors above."""
