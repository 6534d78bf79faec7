"""The depth frame kernel (issue #26): the whole CodePredictor frame as one persistent launch.

What lives where:

* kernel.py: :class:`FrameKernel`, the persistent walk (per task: waits, the task's body, the
  split tiles' cluster handoff, the signal), the weight loader, and what it is built from
  (``FrameBuild``) and walks with (the shared-memory handles, the global tensors, a task's
  phase words, the walk's cursor); ``compile_args`` for offline compiles.
* launch.py: the checks before a launch (:func:`check_launchable`, :func:`check_tile_shapes`,
  :func:`check_chunk_waits`,
  :class:`FrameRefused`) and :class:`ProtocolRun`, one schedule's launch and its buffers.
* host.py: :class:`DepthFrame`, the frame on real weights: its arena (:func:`frame_layout`,
  :class:`Regions`), its input checks (:func:`check_frame_inputs`, :func:`sampler_refusal`,
  :class:`FrameUnsupported`) and its outputs.
* table.py: the phase table (PHASE_FIELDS: where each phase's input and output are).
* projection.py, attention.py, embedding.py: the task bodies the kernel mixes in (the
  projection tiles with their shapes and shared-memory budget; attention; embedding, draw and
  Talker sum).
* weights.py: the projection tiles' weights packed for the page ring, and the arena's
  chunk-major image.

The tile studies (random-data harnesses and the tiles' A/B knobs) are not here but in
experiments/_frame_studies.py: only tests, experiments and scripts build them.
"""
from kernels.depth.frame.kernel import (PTRS, STAMPS, FrameBuild, FrameKernel,
                                        compile_args)
from kernels.depth.frame.launch import (FrameRefused, ProtocolRun, check_chunk_waits,
                                        check_launchable, check_tile_shapes)
from kernels.depth.frame.host import (POISON, DepthFrame, FrameUnsupported, Regions,
                                      check_frame_inputs, frame_layout, sampler_refusal)

__all__ = ["PTRS", "STAMPS", "FrameBuild", "FrameKernel", "compile_args", "FrameRefused",
           "ProtocolRun", "check_launchable", "check_chunk_waits", "check_tile_shapes", "POISON",
           "DepthFrame", "FrameUnsupported", "Regions", "check_frame_inputs", "frame_layout",
           "sampler_refusal"]
