"""Your own flax training step, with D-PSGD from nbsgd_jax.tx: one worker per host device.

    python examples/own_training_loop.py --workers 8 --steps 200

The step is a plain flax / optax one under ``jax.shard_map``; the only line from nbsgd_jax is
the optimizer: SGD, then a gossip over a ring (Lian et al. 2017), ``x_i <- sum_j W_ij (x_j -
lr g_j)``. Swap it for ``tx.choco(...)``, ``tx.local_sgd(...)``, ``tx.diloco(...)`` or put
``tx.allreduce_mean(axis_name="w")`` before the SGD for All-Reduce SGD.
"""
import argparse
import os
import sys

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--workers", type=int, default=8)
ARGS.add_argument("--steps", type=int, default=200)
ARGS.add_argument("--batch", type=int, default=32, help="examples per worker and step")
ARGS.add_argument("--lr", type=float, default=0.1)
args = ARGS.parse_args()
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.workers}")

import flax.linen as nn  # noqa: E402  (after XLA_FLAGS: one CPU device per worker)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from nbsgd_jax import data, tx  # noqa: E402


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.max_pool(nn.relu(nn.Conv(8, (5, 5))(x)), (2, 2), (2, 2))
    return nn.Dense(10)(nn.relu(nn.Dense(64)(x.reshape(x.shape[0], -1))))


def loss_fn(params, images, labels):
  logits = CNN().apply(params, images)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


n = args.workers
if jax.device_count() < n:
  sys.exit(f"--workers {n}: only {jax.device_count()} devices (set XLA_FLAGS before running)")
mesh = jax.make_mesh((n,), ("w",), devices=jax.devices()[:n])
mnist = data.load_dataset("mnist10k")  # embedded; any numpy arrays will do
x_train = mnist.train_images.astype(np.float32) / 255.0
per = len(x_train) // n  # worker i holds examples [i per, (i + 1) per)
shards = (x_train[:n * per].reshape(n, per, 28, 28, 1), mnist.train_labels[:n * per].reshape(n, per))

opt = optax.chain(optax.sgd(args.lr), tx.gossip("ring", axis_name="w"))
params = CNN().init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))  # the same start everywhere
params = jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), params)
state = jax.vmap(opt.init, axis_name="w")(params)
on_workers = NamedSharding(mesh, P("w"))
params, state, shards = jax.device_put((params, state, shards), on_workers)


@jax.jit
@jax.shard_map(mesh=mesh, in_specs=(P("w"), P("w"), P("w"), P()), out_specs=P("w"))
def train_step(params, state, shards, step):
  params, state, (images, labels) = jax.tree.map(lambda a: a[0], (params, state, shards))
  start = (step * args.batch) % (per - args.batch)
  images, labels = (jax.lax.dynamic_slice_in_dim(a, start, args.batch) for a in (images, labels))
  loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
  updates, state = opt.update(grads, state, params)
  params = optax.apply_updates(params, updates)
  return jax.tree.map(lambda a: a[None], (params, state, loss))


for step in range(args.steps):
  params, state, loss = train_step(params, state, shards, step)
  loss.block_until_ready()  # one step in flight: XLA:CPU's collectives can starve otherwise
mean = jax.tree.map(lambda a: a.mean(0), params)  # the averaged model
logits = CNN().apply(mean, mnist.test_images.astype(np.float32) / 255.0)
accuracy = float((logits.argmax(-1) == mnist.test_labels).mean())
print(f"workers {n}  steps {args.steps}  loss {float(loss.mean()):.4f}  "
      f"test accuracy {accuracy:.4f}  MB sent per worker {float(np.asarray(tx.bytes_sent(state))[0]) / 1e6:.2f}")
