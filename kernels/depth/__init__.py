"""The depth-loop kernels (the CodePredictor frame): small-M GEMVs, the skinny split-K
projections (mma.sync, wgmma, register-A wgmma), row norms, attention and the fused draw of the
fast loop; and the persistent frame kernel, the whole frame as one launch (the frame/ package:
its kernel, launch, host side, phase table and task bodies; its __init__ says what lives
where)."""
