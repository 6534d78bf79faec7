"""The depth-loop kernels (the CodePredictor frame): small-M GEMVs, the skinny split-K
projections (mma.sync, wgmma, register-A wgmma), row norms, attention and the fused draw; the
persistent frame kernel will live here too."""
