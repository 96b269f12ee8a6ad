"""Strata: a GGUF runner for qwen4exp (Qwen3.8-Flash-Next) with MoE expert offload."""
from ._native import StrataError, FormatError, NotFoundError, UnsupportedError, build_info  # noqa: F401
from .gguf import gguf_info  # noqa: F401
from .model import Model, Session  # noqa: F401

__version__ = "0.1.0"
