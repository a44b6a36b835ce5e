"""Test set-up: 8 simulated host devices for the mesh backend (must precede jax import)."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# no persistent compilation cache under the tests (two xdist processes would write one
# directory at once); tests/test_runs_as_data.py checks the cache in its own directory
os.environ.setdefault("NBSGD_JAX_COMPILATION_CACHE", "none")
