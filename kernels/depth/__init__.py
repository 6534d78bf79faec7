"""The depth-loop kernels (the CodePredictor frame): small-M GEMVs, the skinny split-K
projections (mma.sync, wgmma, register-A wgmma), row norms, attention and the fused draw of the
fast loop; and the persistent frame kernel, the whole frame as one launch (frame.py: the host
side; frame_protocol.py: the walk; frame_tiles.py, frame_attention.py, frame_embed.py: the task
bodies; frame_studies.py: the tile studies)."""
