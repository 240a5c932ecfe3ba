"""The string options of the public API as ``Literal`` types (no runtime cost, no imports).

Any layer may import this module: it depends on nothing.
"""

from __future__ import annotations

from typing import Literal

#: How a model's layers are spread over several devices (llama.cpp's ``--split-mode``).
SplitMode = Literal["none", "layer", "row", "tensor"]
#: llama.cpp's flash-attention switch (``--flash-attn``).
FlashAttn = Literal["auto", "on", "off"]
#: The verification rule of a speculative run (see docs/design.md, "rules").
VerifyRule = Literal["token", "block", "exact-match"]
#: Why a generation ended.
StopReason = Literal["eos", "stop", "length", "context_full"]
#: OpenAI's finish_reason of a chat completion.
FinishReason = Literal["stop", "length", "tool_calls"]
#: Which logits rows a decode returns: the last token's, every token's, or one flag per token.
OutputsSpec = Literal["last", "all"]
#: States of llama.cpp's reasoning-budget sampler.
BudgetState = Literal["idle", "counting", "forcing", "waiting_utf8", "done"]

__all__ = ["BudgetState", "FinishReason", "FlashAttn", "OutputsSpec", "SplitMode", "StopReason", "VerifyRule"]
