"""Speculative decoding (DESIGN §4): the DSpark drafter and its distillation from the target."""

from kestrel.spec.drafter import DraftOutput, DSparkConfig, DSparkDrafter

__all__ = ["DSparkConfig", "DSparkDrafter", "DraftOutput"]
