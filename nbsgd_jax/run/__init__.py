"""The run: set-up from a config (:mod:`~nbsgd_jax.run.setup`), backends, the task (data and
loss), evaluation, records, the stopwatch and the loop (:func:`~nbsgd_jax.run.loop.train`)."""
