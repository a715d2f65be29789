"""mocojax: momentum-coupled rubric adaptation (MoCo Rubric) for Qwen3-VL in JAX/Flax NNX."""

__version__ = "0.1.0"
