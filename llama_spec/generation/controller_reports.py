"""The speculation controller's reports (controller.py): every option's prediction (``llama-spec
tune``), what was chosen how often and the measured rates (the stats line and JSON), and its file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..kernels.tree_shape import tree_node_count
from .arms import SlotState, tree_name

if TYPE_CHECKING:
    from .cost_model import CostModel
    from .draft_length import DraftLengthController

__all__ = ["ControllerReports"]


class ControllerReports:
    """Reports of a :class:`~.controller.SpecController` (its base: it reads only what is declared here)."""

    slots: dict[int, SlotState]
    cost: CostModel
    accept: DraftLengthController
    choices: dict[str, int]
    lengths: np.ndarray
    explored: int

    def step_cost(self, k_cap: int, n_seqs: int) -> np.ndarray:
        raise NotImplementedError

    def table(self, slot: int, k_max: int, band: str, n_seqs: int = 1,
              tree: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
        """Every option's prediction for `slot` (member, k, expected tokens, seconds, tokens/s); with
        `tree`, its tree member's trees of that shape at every depth k (verified in 1 + nodes rows)."""
        st = self.slots[slot]
        v = self.step_cost(k_max, n_seqs)
        rows: list[dict[str, Any]] = [{"option": "plain", "k": 0, "tokens": 1.0, "seconds": float(v[0]),
                                       "tok_per_s": float(1.0 / v[0]) if v[0] > 0 else float("nan")}]
        for name in st.names:
            e = 1.0 + np.cumsum(self.accept.survival_of([(name, band, False), (name, band, True)], k_max))
            d = self.cost.draft_cost(name, np.arange(1, k_max + 1))
            t = v[1:] + (d if d is not None else np.nan)
            for k in range(1, k_max + 1):
                rows.append({"option": name, "k": k, "tokens": float(e[k - 1]), "seconds": float(t[k - 1]),
                             "tok_per_s": float(e[k - 1] / t[k - 1])})
        if tree and st.tree_member is not None:
            name = tree_name(st.names[st.tree_member], tree)
            nodes = np.array([tree_node_count(tree[:j]) for j in range(1, len(tree) + 1)])
            e = 1.0 + np.cumsum(self.accept.survival_of([(name, band, False), (name, band, True)], len(tree)))
            d = self.cost.draft_cost(name, np.arange(1, len(tree) + 1))
            t = self.step_cost(int(nodes[-1]), n_seqs)[nodes] + (d if d is not None else np.nan)
            rows += [{"option": name, "k": k, "tokens": float(e[k - 1]), "seconds": float(t[k - 1]),
                      "tok_per_s": float(e[k - 1] / t[k - 1])} for k in range(1, len(tree) + 1)]
        return rows

    def summary(self) -> dict[str, Any]:
        """What was chosen how often and the measured rates (for the stats line and JSON)."""
        ks = np.arange(1, 6)
        c = self.step_cost(4, 1)
        out: dict[str, Any] = {"chosen": dict(self.choices), "explored": int(self.explored),
                               "lengths": {int(k): int(n) for k, n in enumerate(self.lengths) if n},
                               "step_ms": {int(n): round(1e3 * float(x), 2) for n, x in zip(ks, c, strict=True)
                                           if not np.isnan(x)}}
        draft: dict[str, float] = {}
        for name in self.cost.draft_lines:
            d = self.cost.draft_cost(name, np.array([0, 3]))
            if d is not None:
                draft[name] = round(1e3 * float(d[1] - d[0]) / 3.0, 3)
        out["draft_ms_per_token"] = draft
        out["acceptance"] = {k: round(v, 3) for k, v in self.accept.pooled(_member_band).items()}
        return out

    def describe(self, choices: bool = True) -> str:
        """One line: what was chosen (all requests so far; choices=False: left out, as a solo
        run's SpecStats line says it) and the measured step costs, draft costs and acceptance."""
        s = self.summary()
        chosen = " ".join(f"{k}={v}" for k, v in s["chosen"].items())
        lengths = " ".join(f"{k}:{v}" for k, v in s["lengths"].items())
        step = " ".join(f"c({k})={v}ms" for k, v in s["step_ms"].items())
        draft = " ".join(f"{k}={v}ms/tok" for k, v in s["draft_ms_per_token"].items())
        acc = " ".join(f"{k}={100 * v:.0f}%" for k, v in s["acceptance"].items())
        head = f"auto: chosen {chosen} (explored {s['explored']}); k {lengths}; " if choices else "auto measured: "
        return f"{head}{step}; draft {draft}; kept {acc}"

    def save(self, path: str | Path) -> None:
        """The cost model and the survival counts as JSON (``cost_model=path`` reads it back)."""
        data = {"version": 1, "cost": self.cost.to_dict(), "survival": self.accept.export()}
        Path(path).write_text(json.dumps(data, indent=1))


def _member_band(key: object) -> str:
    """'member@band' of a survival key (member, band, last_full)."""
    return f"{key[0]}@{key[1]}" if isinstance(key, tuple) and len(key) == 3 else str(key)
