"""Qwen3-TTS 1.7B CodePredictor shapes (the real 1.7B values, not the library defaults) and the
record a depth loop returns. Data only: no torch work."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CodePredictorConfig:
    hidden: int = 1024
    intermediate: int = 3072
    layers: int = 5
    q_heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    rms_eps: float = 1e-6
    rope_theta: float = 1e6
    talker_hidden: int = 2048  # the projection maps Talker space (2048) to 1024
    vocab: int = 2048  # entries per code group g1..g15
    talker_vocab: int = 3072  # g0's codebook: the Talker's codec embedding rows
    groups: int = 16  # g0 (from the Talker) + g1..g15 (drawn here)
    positions: int = 16  # depth positions per frame

    @property
    def q_dim(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    @property
    def heads_drawn(self) -> int:
        return self.groups - 1

    def layer_weight_bytes(self, elem_bytes: int = 2) -> int:
        h, i = self.hidden, self.intermediate
        return elem_bytes * (self.qkv_dim * h + h * self.q_dim + 2 * i * h + h * i)


QWEN3_TTS_1P7B = CodePredictorConfig()


@dataclass
class LoopOutput:
    codes: torch.Tensor  # [R, 15] int64: g1..g15
    talker_sum: torch.Tensor  # [R, talker_hidden] in the loop's dtype
    kv: list  # per layer (K, V): [R, kv_heads, 16, head_dim]
    logits: torch.Tensor  # [R, 15, vocab] fp32
