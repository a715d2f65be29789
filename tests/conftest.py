"""Shared pytest setup: CPU only, quiet logs, small thread pools on this 2-core machine."""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

try:
    import torch  # noqa: E402

    torch.set_num_threads(2)
except ImportError:  # torch is a test-only dependency; tests that need it import it themselves
    pass
