"""P2's persistent work queue (kernels/nvfp4/workqueue.py, producers/ring_queue.py; issue #39):
its static layout and host checks (CPU), the kernel it compiles to (CPU: the synchronisation it
promises is in the PTX, no spills), and on the H200 its output bit for bit against the whole
call's 256-token build, its counters' final values, and two requests on two streams."""
from __future__ import annotations

import pytest
import torch

from producers.ring_queue import QueueLayout, done_slot, ready_slot


# ---- layout (CPU) -----------------------------------------------------------------------------
def test_layout_derives_the_ring_and_counters():
    q = QueueLayout(512, 3, 4)
    assert (q.chunk_tiles, q.ring_rows, q.ring_tiles) == (2, 1536, 6)
    assert q.chunks(1) == 1 and q.chunks(512) == 1 and q.chunks(513) == 2
    assert q.counter_words(37810) == 1 + 2 * 74
    assert ready_slot(0) == 1 and done_slot(0, 74) == 75 and done_slot(73, 74) == 148
    names = q.counter_names(1100)  # 3 chunks, the last of 76 rows
    assert names[0] == "claim" and names[ready_slot(2)].startswith("ready[2]")
    assert names[done_slot(0, 3)].startswith("done[0]") and len(names) == q.counter_words(1100)
    assert q.expected_counts(1100, 10) == [0, 4, 4, 4, 20, 20, 10]


def test_a_counter_wait_report_names_the_counter():
    from device import waits
    q = QueueLayout(256, 2, 1)
    old = waits._MAILBOX
    box = waits.diagnostics_mailbox() if torch.cuda.is_available() else None
    if box is None:  # a stand-in mailbox: the report is host arithmetic
        waits._MAILBOX = box = torch.zeros(8, dtype=torch.int32)
    saved = box.clone()
    try:
        box[:7] = torch.tensor([waits.MAILBOX_MAGIC, int(waits.Barrier.COUNTER), ready_slot(1),
                                1, 5, 12, 0], dtype=torch.int32)
        msg = waits.mailbox_report(q.counter_names(600))
        assert "ready[1] (quantizers of chunk 1)" in msg and "CTA 5" in msg and "holds 0" in msg
    finally:
        box.copy_(saved)
        waits._MAILBOX = old


@pytest.mark.parametrize("kw, err", [
    (dict(capacity=128, slots=2, producers=1), ValueError),  # not whole 256-token tiles
    (dict(capacity=0, slots=2, producers=1), ValueError),
    (dict(capacity=256, slots=1, producers=1), ValueError),
    (dict(capacity=256, slots=2, producers=0), ValueError),
    (dict(capacity=256.0, slots=2, producers=1), TypeError),
    (dict(capacity=256, slots=True, producers=1), TypeError),
    (dict(capacity=256, slots=2, producers=1, loads=0), ValueError),
])
def test_layout_refuses(kw, err):
    with pytest.raises(err):
        QueueLayout(**kw)


# ---- host checks (CPU standing in for the GPU) --------------------------------------------------
def _cpu_operands(M=1024, N=512, K=256, dtype=torch.bfloat16):
    from kernels.nvfp4.prepack import PrepackedWeights
    x = torch.randn(M, K).to(dtype)
    pre = PrepackedWeights(torch.zeros(N // 64, K // 64, 128, 16, dtype=torch.uint8),
                           torch.zeros(N // 64, K // 64, 32, 8, dtype=torch.uint8), N, K)
    return x, pre, torch.ones(1)


@pytest.mark.parametrize("change, err, match", [
    (dict(x="list"), TypeError, "torch.Tensor"),
    (dict(x=torch.randn(64, 256, dtype=torch.float32)), TypeError, "dtype"),
    (dict(x=torch.randn(64, 250).bfloat16()), ValueError, "multiple of 32"),
    (dict(x=torch.randn(64, 48).bfloat16()), ValueError, "multiple of 32"),
    (dict(x=torch.randn(0, 256).bfloat16()), ValueError, "M >= 1"),
    (dict(prepacked="codes"), TypeError, "prepack"),
    (dict(capacity=300), ValueError, "multiple of 256"),
    (dict(slots=1), ValueError, "slots"),
    (dict(producers=0), ValueError, "producers"),
    (dict(out=torch.empty(1024, 256, dtype=torch.bfloat16)), ValueError, "out is"),
])
def test_plan_queue_refuses_bad_arguments_before_any_device_work(change, err, match):
    from kernels.nvfp4.workqueue import plan_queue
    x, pre, g_w = _cpu_operands()
    args = dict(x=x, prepacked=pre, g_w=g_w)
    kw = {k: v for k, v in change.items() if k not in args}
    args.update({k: v for k, v in change.items() if k in args})
    with pytest.raises(err, match=match):
        plan_queue(args["x"], args["prepacked"], args["g_w"], **kw)


def test_quantizer_ctas_follow_the_builds_weight_tiles(monkeypatch):
    """The plan table's quantizers (session 24's sweeps: qkv's 168 and fc1's 112 weight tiles
    fastest at 3, out's 42 at 12), chosen by plan_queue when none is asked for."""
    import kernels.nvfp4.workqueue as W
    from schedules import plan as P
    from tests.cpu_stand_in import cpu_as_gpu
    assert [P.WORKQUEUE.producers_for(t) for t in (168, 112, 77, 76, 42, 1)] == [3, 3, 3, 12,
                                                                                12, 12]
    monkeypatch.setattr(W, "sm_count", lambda: 132)
    monkeypatch.setattr(W, "check_co_resident", lambda ctas, what: None)
    monkeypatch.setattr(W, "_check_prepacked", lambda pre, N, K, device: None)
    for N, tiles, want in ((21504, 168, 3), (14336, 112, 3), (5376, 42, 12)):
        x, pre, g_w = _cpu_operands(M=4096, N=N, K=64)
        with cpu_as_gpu(W):
            p = W.plan_queue(x, pre, g_w)
            assert (p.layout.producers, -(-N // p.whole.tile_n)) == (want, tiles)
            assert W.plan_queue(x, pre, g_w, producers=3).layout.producers == 3


def test_plan_queue_refuses_a_swap_ab_size_call_and_too_many_producers(monkeypatch):
    import kernels.nvfp4.workqueue as W
    from tests.cpu_stand_in import cpu_as_gpu
    monkeypatch.setattr(W, "sm_count", lambda: 132)
    x, pre, g_w = _cpu_operands(M=128, N=512, K=256)
    with cpu_as_gpu(W), pytest.raises(ValueError, match="256-token"):
        W.plan_queue(x, pre, g_w)
    x, pre, g_w = _cpu_operands(M=4096, N=8192, K=256)
    with cpu_as_gpu(W), pytest.raises(ValueError, match="no SM"):
        W.plan_queue(x, pre, g_w, producers=132)
    from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
    for other in (BlockscaledGemmSm90.wide_f16(splits=2),
                  BlockscaledGemmSm90.wide_f16(stream_k=True)):
        with cpu_as_gpu(W), pytest.raises(ValueError, match="one-split tile-loop"):
            W.plan_queue(x, pre, g_w, config=other)


def test_co_residency_refuses_mps_and_a_grid_that_does_not_fit(monkeypatch):
    from device import residency as R
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps")
    with pytest.raises(R.NotCoResident, match="MPS"):
        R.check_co_resident(132, "the grid")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY")
    monkeypatch.setattr(R, "max_active_clusters", lambda dev, size: 120)
    monkeypatch.setattr(R.torch.cuda, "current_device", lambda: 0)
    with pytest.raises(R.NotCoResident, match="fits 120"):
        R.check_co_resident(132, "the grid")
    R.check_co_resident(120, "the grid")


# ---- the block gate experiment (CPU: its arithmetic and refusals) ------------------------------
def test_block_gate_counts_the_unfused_activation_and_refuses_before_gpu_work(tmp_path, capsys):
    from experiments import p2_block_gate as B
    # packed (37824 x 2688) + swizzled scales (37888 x 336) + f16 (37810 x 5376 x 2)
    assert B.activation_bytes(37810, 5376) == 37824 * 2688 + 37888 * 336 + 37810 * 5376 * 2
    assert B.main(["--capacity", "100", "--results-dir", str(tmp_path)]) == 2
    assert "multiple of 256" in capsys.readouterr().err
    assert B.main(["--rounds", "0", "--results-dir", str(tmp_path)]) == 2
    assert B.main(["--layouts", "256x3", "--results-dir", str(tmp_path)]) == 2
    assert "CAPACITYxSLOTSxPRODUCERS" in capsys.readouterr().err
    assert B.main(["--layouts", "256x1x2", "--results-dir", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
    assert B.parse_layouts("256x3x2, 512x2x8") == {
        "workqueue 256x3x2": {"capacity": 256, "slots": 3, "producers": 2},
        "workqueue 512x2x8": {"capacity": 512, "slots": 2, "producers": 8}}


# ---- compile (CPU) ------------------------------------------------------------------------------
@pytest.mark.compile
@pytest.mark.parametrize("layout", [QueueLayout(256, 3, 4), QueueLayout(512, 2, 1, bf16=False)])
def test_queue_build_compiles_with_its_synchronisation(layout):
    """The queue build compiles for sm_90a without spills at the three-warpgroup cap, and its
    PTX holds what the protocol promises: the quantizers' and consumers' release adds, the
    acquire loads of the bounded waits (which trap), and the async-proxy fences on both sides
    of the ring."""
    from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, compile_args
    from workbench.compile import compile_report
    cfg = BlockscaledGemmSm90.wide_f16_queue(layout)
    assert cfg.queue_producers == layout.producers and cfg.threads == 384
    r = compile_report(cfg, *compile_args(M=1024, N=512, K=256))
    assert r.spill_bytes == 0 and r.registers <= 168
    ptx = r.ptx
    assert ptx.count("red.release.gpu.global.add.s32") >= 2  # ready (quantizer), done (consumer)
    assert ptx.count("ld.acquire.gpu.global.b32") >= 2  # waits on ready and on done
    assert ptx.count("fence.proxy.async.global") >= 2
    assert "fence.acq_rel.gpu" in ptx and "trap;" in ptx
    plain = compile_report(BlockscaledGemmSm90.wide_f16(), *compile_args(M=1024, N=512, K=256))
    assert "red.release.gpu" not in plain.ptx  # the production build carries none of it


@pytest.mark.compile
def test_queue_build_with_the_gated_residual_epilogue_compiles():
    from kernels.nvfp4.gemm import GATE_RESIDUAL
    from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, compile_args
    from workbench.compile import compile_report
    cfg = BlockscaledGemmSm90.wide_f16_queue(QueueLayout(256, 3, 4)).with_output(GATE_RESIDUAL)
    r = compile_report(cfg, *compile_args(M=1024, N=512, K=256))
    assert r.spill_bytes == 0 and r.registers <= 168


# ---- GPU ----------------------------------------------------------------------------------------
def _gpu_operands(M, N, K, seed):
    """A heavy-tailed bf16 activation, its device tensor scale, an NVFP4 weight with its
    prepack, and the activation's quantize-and-expand (the whole call's A)."""
    from kernels.nvfp4.amax import amax
    from kernels.nvfp4.prepack import prepack
    from kernels.nvfp4.quantize import quantize_expand_nvfp4
    from numerics import nvfp4
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(M, K, generator=gen, device="cuda")
         * torch.exp(torch.randn(K, generator=gen, device="cuda"))).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
    g_w = nvfp4.global_scale(w).reshape(1)
    w_q, w_s = nvfp4.quantize(w, g_w)
    g = nvfp4.global_scale_from_amax(amax(x)).reshape(1)
    q, s, f16 = quantize_expand_nvfp4(x, g, pad_16x=True)
    return x, g, (w_q, w_s, g_w), prepack(w_q, w_s), (q, s, f16)


def _wide():
    """The 256-token build, given explicitly: the chooser's switch to it moves between
    versions, and what is tested here is the queue against the same build's whole call."""
    from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
    return BlockscaledGemmSm90.wide_f16()


def _whole(g, w, pre, a, M, config):
    from kernels.nvfp4.gemm import gemm_nvfp4
    q, s, f16 = a
    return gemm_nvfp4(q, s, g, *w, prepacked=pre, a16=f16, rows=(0, M), config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, layout", [
    (2048, 8192, 256, (256, 2, 1)),   # 8 chunks, the ring reused 4 times, one quantizer
    (2048, 8192, 256, (256, 3, 4)),   # the default
    (700, 8208, 160, (512, 2, 3)),    # partial last chunk, token tile, weight tile and k-block
    (1300, 4096, 1024, (256, 4, 2)),  # N with a partial last weight tile
    (8192, 128, 256, (256, 2, 1)),    # one weight tile: the GEMM runs far ahead, 16 reuses
])
def test_queue_is_bit_identical_to_the_whole_call(M, N, K, layout):
    """Into a NaN-poisoned output: every element equal to the whole call's 256-token build on
    the whole expansion (poisoned elements would differ), a rerun identical, and the counters as
    the protocol leaves them (each chunk ready from every quantizer, each tile counted done)."""
    from device.waits import synchronize
    from kernels.nvfp4.workqueue import plan_queue
    x, g, w, pre, a = _gpu_operands(M, N, K, seed=M + N + K)
    g_w = w[2]
    capacity, slots, producers = layout
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    p = plan_queue(x, pre, g_w, capacity=capacity, slots=slots, producers=producers, out=out,
                   config=_wide())
    want = _whole(g, w, pre, a, M, p.whole)
    counters = torch.zeros(p.layout.counter_words(M), dtype=torch.int32, device="cuda")
    p.run(g, counters=counters)
    again = plan_queue(x, pre, g_w, capacity=capacity, slots=slots, producers=producers,
                       config=_wide()).run(g)
    synchronize()
    assert counters.tolist() == p.layout.expected_counts(M, -(-N // 128))
    assert not out.isnan().any()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))


@pytest.mark.gpu
def test_queue_bits_hold_over_many_runs_of_a_short_k():
    """Fifty launches where the ring turns over fastest (short K, two slots, many chunks): a
    write-after-read race on a slot would show as a differing run."""
    from kernels.nvfp4.workqueue import plan_queue, synchronize
    M, N, K = 4096, 1024, 64
    x, g, w, pre, a = _gpu_operands(M, N, K, seed=11)
    p = plan_queue(x, pre, w[2], capacity=256, slots=2, producers=2, config=_wide())
    want = _whole(g, w, pre, a, M, p.whole).view(torch.int16)
    outs = [p.run(g) for _ in range(50)]
    synchronize(p)
    bad = [i for i, o in enumerate(outs) if not torch.equal(o.view(torch.int16), want)]
    assert not bad, f"runs {bad} differ"


@pytest.mark.gpu
def test_queue_with_the_gated_residual_add_equals_the_whole_call_in_place():
    """P4's epilogue through the queue (the H3 block's out projection), residual = out (in
    place, as the model calls it): equal to the whole call's gated build."""
    from device.waits import synchronize
    from kernels.nvfp4.gemm import gemm_nvfp4
    from kernels.nvfp4.workqueue import plan_queue
    M, N, K = 1300, 4096, 512
    x, g, w, pre, (q, s, f16) = _gpu_operands(M, N, K, seed=7)
    gen = torch.Generator(device="cuda").manual_seed(8)
    gate = (0.2 * torch.randn(N, generator=gen, device="cuda")).bfloat16()
    res = torch.randn(M, N, generator=gen, device="cuda").bfloat16()
    p = plan_queue(x, pre, w[2], gate=gate, residual=res.clone(), out=None, config=_wide())
    want = gemm_nvfp4(q, s, g, *w, prepacked=pre, a16=f16, rows=(0, M), config=p.whole,
                      gate=gate, residual=res.clone())
    inplace = res.clone()
    plan_queue(x, pre, w[2], gate=gate, residual=inplace, out=inplace, config=_wide()).run(g)
    synchronize()
    assert torch.equal(inplace.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
def test_two_requests_on_two_streams_each_equal_their_own_whole_call():
    """Each run allocates its ring and counters on its stream: two overlapping requests with
    different activations never share a slot or a counter."""
    from device.waits import synchronize
    from kernels.nvfp4.workqueue import plan_queue
    cases = [_gpu_operands(1536, 8192, 512, seed=s) for s in (1, 2)]
    outs, wants = [], []
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for (x, g, w, pre, a), st in zip(cases, streams):
        p = plan_queue(x, pre, w[2], config=_wide())
        wants.append(_whole(g, w, pre, a, 1536, p.whole))
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            outs.append(p.run(g))
    torch.cuda.synchronize()
    synchronize()
    for o, w in zip(outs, wants):
        assert torch.equal(o.view(torch.int16), w.view(torch.int16))


_STALL = """
import torch
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
from kernels.nvfp4.workqueue import plan_queue, synchronize
from tests.test_p2_workqueue import _gpu_operands
x, g, w, pre, _ = _gpu_operands(2048, 8192, 256, seed=5)
p = plan_queue(x, pre, w[2], capacity=256, slots=2, producers=2,
               config=BlockscaledGemmSm90.wide_f16())
counters = torch.zeros(p.layout.counter_words(2048), dtype=torch.int32, device="cuda")
counters[1 + 3] = -1  # chunk 3 can never be ready: its tiles' waits time out
p.run(g, counters=counters)
synchronize(p)
"""


@pytest.mark.gpu
def test_a_chunk_that_never_becomes_ready_traps_with_the_counters_name():
    """A wait that can never complete ends the launch after 1 s (no hang) and the error names
    the counter, not a barrier behind it (a trapped kernel ends its CUDA context: a fresh
    process). The ready word starts at -1, so chunk 3 holds one quantizer signal short."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))
    r = subprocess.run([sys.executable, "-c", _STALL], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode != 0
    # the GEMM CTAs' wait on ready[3] or, as fast, a quantizer's wait on the tiles of chunk 3
    # (the slot it would refill): whichever times out first writes the report
    assert ("ready[3] (quantizers of chunk 3)" in r.stderr
            or "done[3] (tiles of chunk 3 read)" in r.stderr), r.stderr[-2000:]


@pytest.mark.gpu
def test_queue_refuses_before_the_launch_on_the_gpu():
    from kernels.nvfp4.workqueue import plan_queue
    x, g, w, pre, _ = _gpu_operands(2048, 8192, 256, seed=3)
    g_w = w[2]
    p = plan_queue(x, pre, g_w, config=_wide())
    with pytest.raises(TypeError, match="tensor scale"):
        p.run(1.0)
    with pytest.raises(ValueError, match="256-token"):
        plan_queue(x[:128], pre, g_w)
