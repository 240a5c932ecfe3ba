"""Deprecated module paths (one release): ``import llama_spec.accept`` and the like still work.

Round 3 grouped the modules by layer (folder = layer, docs/design.md). An import of an old path
gets the new module itself (one module object, so isinstance checks and monkeypatching agree) and a
DeprecationWarning naming the new path. Nothing is imported until an old path is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

MOVED: dict[str, str] = {
    "llama_spec.accept": "llama_spec.kernels.token",
    "llama_spec.accept_block": "llama_spec.kernels.block",
    "llama_spec.accept_tree": "llama_spec.kernels.tree",
    "llama_spec.tree_shape": "llama_spec.kernels.tree_shape",
    "llama_spec.stats": "llama_spec.observe.stats",
    "llama_spec.observers": "llama_spec.observe.observers",
    "llama_spec.chat_template": "llama_spec.chat_api.template",
    "llama_spec.hub": "llama_spec.models.hub",
    "llama_spec.models_registry": "llama_spec.models.registry",
    "llama_spec.gguf_check": "llama_spec.models.gguf_check",
    "llama_spec.evaluation": "llama_spec.generation.evaluation",
    "llama_spec.draft_length": "llama_spec.generation.draft_length",
    "llama_spec.tree_verify": "llama_spec.generation.tree",
    "llama_spec.speculative": "llama_spec.generation.solo",
    "llama_spec.batch": "llama_spec.generation.batch",
    "llama_spec.model": "llama_spec.llama.model",
    "llama_spec.context": "llama_spec.llama.context",
    "llama_spec.sampling": "llama_spec.llama.sampling",
    "llama_spec.grammar": "llama_spec.llama.grammar",
    "llama_spec.backends": "llama_spec.llama.devices",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new}; the old path goes away in the next release",
                      DeprecationWarning, stacklevel=3)
        return importlib.import_module(self.new)

    def exec_module(self, module: types.ModuleType) -> None:
        """The new module has run already."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder on sys.meta_path once (the package's __init__ calls it)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
