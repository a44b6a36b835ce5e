"""Local launcher of a multi-process run (``backend="multihost"``) on one machine.

    python -m nbsgd_jax.launch --num_processes=2 --devices_per_process=4 -- \\
        --config=experiments/configs/mnist.py --workdir=runs/mh --config.num_workers=8

starts ``num_processes`` copies of ``python -m nbsgd_jax.main <the arguments after -->
--config.backend=multihost`` on loopback, each with ``devices_per_process`` CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count``) and gloo collectives, joined through
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``
(:mod:`nbsgd_jax.core.multihost`). Every line the processes print is forwarded, prefixed with
``[pK]``. If one process exits with an error the others are stopped at once and the
launcher exits with that status (it does not wait for the survivors' collectives to time
out). On a real cluster, start ``nbsgd_jax.main`` on every host yourself with those three
variables (or ``--coordinator_address``, ``--num_processes``, ``--process_id``) instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
  """A TCP port on loopback that was free a moment ago."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(base: dict, process_id: int, num_processes: int, devices: int,
                address: str) -> dict:
  """The environment of process ``process_id``: its device count in ``XLA_FLAGS`` (any
  earlier ``--xla_force_host_platform_device_count`` replaced), CPU platform and the
  coordinates."""
  env = dict(base)
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                 env.get("XLA_FLAGS", "")).strip()
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["JAX_COORDINATOR_ADDRESS"] = address
  env["JAX_NUM_PROCESSES"] = str(num_processes)
  env["JAX_PROCESS_ID"] = str(process_id)
  env["PYTHONUNBUFFERED"] = "1"
  return env


def main_args(args: list[str]) -> list[str]:
  """The arguments of ``nbsgd_jax.main``, with ``--config.backend=multihost`` added.

  Raises:
    ValueError: the arguments ask for another backend.
  """
  out = list(args)
  for a in out:
    if a.startswith("--config.backend="):
      if a.split("=", 1)[1] != "multihost":
        raise ValueError(f"{a} is not allowed with nbsgd_jax.launch: it runs "
                         "--config.backend=multihost (drop the flag)")
      return out
  return out + ["--config.backend=multihost"]


def _forward(stream, prefix: str, sink) -> None:
  for line in iter(stream.readline, ""):
    sink.write(f"{prefix} {line}" if line.strip() else line)
    sink.flush()
  stream.close()


def launch(num_processes: int, devices_per_process: int, args: list[str],
           port: int = 0, timeout: float | None = None,
           program: list[str] | None = None) -> int:
  """Run the processes; returns 0 when all succeed, else the first failing exit status
  (124 on ``timeout`` seconds).

  Args:
    num_processes: processes to start on this machine.
    devices_per_process: CPU devices of each.
    args: ``nbsgd_jax.main``'s arguments (``--config.backend=multihost`` is added).
    port: coordinator port on 127.0.0.1 (0: a free one).
    timeout: seconds before the processes are stopped (None: no limit).
    program: the command to start instead of ``python -m nbsgd_jax.main`` (then ``args``
      are passed unchanged), e.g. your own script calling :func:`nbsgd_jax.train.train`.

  Raises:
    ValueError: ``num_processes`` or ``devices_per_process`` < 1, or another backend asked
      for in ``args``.
  """
  if num_processes < 1:
    raise ValueError(f"--num_processes={num_processes} is not allowed: it must be >= 1")
  if devices_per_process < 1:
    raise ValueError(f"--devices_per_process={devices_per_process} is not allowed: it must "
                     "be >= 1")
  if program is None:
    cmd = [sys.executable, "-m", "nbsgd_jax.main"] + main_args(args)
  else:
    cmd = list(program) + list(args)
  address = f"127.0.0.1:{port or free_port()}"
  procs, threads = [], []
  for p in range(num_processes):
    env = process_env(os.environ, p, num_processes, devices_per_process, address)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)
    procs.append(proc)
    t = threading.Thread(target=_forward, args=(proc.stdout, f"[p{p}]", sys.stdout),
                         daemon=True)
    t.start()
    threads.append(t)
  status, start = 0, time.monotonic()
  try:
    while True:
      codes = [proc.poll() for proc in procs]
      failed = [c for c in codes if c not in (None, 0)]
      if failed:
        bad = codes.index(failed[0])
        status = failed[0] if failed[0] > 0 else 128 - failed[0]  # killed by signal -code
        print(f"[launch] process {bad} exited with status {status}: stopping the others",
              file=sys.stderr, flush=True)
        break
      if all(c == 0 for c in codes):
        break
      if timeout is not None and time.monotonic() - start > timeout:
        print(f"[launch] timeout after {timeout:.0f} s: stopping the processes",
              file=sys.stderr, flush=True)
        status = 124
        break
      time.sleep(0.2)
  except KeyboardInterrupt:
    status = 130
  finally:
    for proc in procs:
      if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
          os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in procs:
      try:
        proc.wait(max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for t in threads:
      t.join(timeout=5)
  return status


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if "--" in argv:
    split = argv.index("--")
    own, rest = argv[:split], argv[split + 1:]
  else:
    own, rest = argv, []
  ap = argparse.ArgumentParser(
      prog="python -m nbsgd_jax.launch",
      description="Start a multihost run as several local processes (loopback, gloo).",
      epilog="Example: python -m nbsgd_jax.launch --num_processes=2 --devices_per_process=4 "
             "-- --config=experiments/configs/mnist.py --workdir=runs/mh")
  ap.add_argument("--num_processes", type=int, default=2)
  ap.add_argument("--devices_per_process", type=int, default=1,
                  help="CPU devices per process (XLA host platform device count)")
  ap.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
  ap.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
  a = ap.parse_args(own)
  if not rest:
    ap.error("give nbsgd_jax.main's arguments after --, e.g. -- "
             "--config=experiments/configs/mnist.py --workdir=runs/mh")
  try:
    return launch(a.num_processes, a.devices_per_process, rest, a.port, a.timeout)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
