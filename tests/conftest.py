"""Test set-up: 8 simulated host devices for the mesh backend (must precede jax import)."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
