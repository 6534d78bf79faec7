"""The conversion-rate probe (experiments/conversion_rate.py) times the instruction it names: the
SASS of its loop is that instruction, with no spills. On the GPU, every rate is measured (no
timing is asserted: timings live in the experiment's summary)."""
import re

import pytest
from cutlass import Int32
from cutlass.cute.runtime import make_fake_stream

from device.runtime import pointer_args
from kernels.nvfp4.conversion_probe import OPS, PTRS, ConversionRateProbe
from workbench.compile import compile_report

SASS_OF = {"cvt_e4m3x2_f16x2": "F2FP.F16.E4M3.UNPACK_B", "prmt": "PRMT", "lop3": "LOP3",
           "hmul2": "HMUL2|HFMA2"}  # ptxas writes some f16x2 multiplies as HFMA2 with a zero addend


@pytest.mark.compile
@pytest.mark.parametrize("op", sorted(OPS))
def test_probe_loop_is_the_instruction_it_names(op):
    rep = compile_report(ConversionRateProbe(op), *pointer_args(PTRS), Int32(1), Int32(1),
                         make_fake_stream())
    assert rep.spill_bytes == 0
    if rep.sass is None:
        pytest.skip("nvdisasm not installed: SASS not checked")
    assert len(re.findall(rf"\b({SASS_OF[op]})\b", rep.sass)) >= 32


def test_probe_refuses_an_unknown_op():
    with pytest.raises(ValueError, match="op must be one of"):
        ConversionRateProbe("cvt_e2m1")


@pytest.mark.gpu
def test_rates_are_measured():
    from experiments.conversion_rate import measure

    rows = {op: measure(op, iters=256, repeats=1) for op in OPS}
    assert all(r["instr_per_clk_per_sm"] > 0 for r in rows.values())
