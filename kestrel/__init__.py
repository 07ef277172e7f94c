"""Kestrel: serve and RL-train K3-style hybrid models (KDA + MLA + LatentMoE + attention residuals)."""

from kestrel.config import ServerArgs

__all__ = ["Engine", "ServerArgs"]


def __getattr__(name):
    # the engine pulls in torch and the model code: load it on first use, not on `import kestrel`
    if name == "Engine":
        from kestrel.engine.engine import Engine

        return Engine
    raise AttributeError(name)
