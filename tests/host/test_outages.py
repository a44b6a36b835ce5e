"""The event clock's failures (``nbsgd_jax/host/outages.py``) against closed forms: spans in
seconds laid at each worker's nominal step time, a computation through them."""

import numpy as np
import pytest

from nbsgd_jax.host import failures as failures_lib
from nbsgd_jax.host.outages import Outages

S0 = 0.5  # s, nominal step


def _outages(spec="1:4:2,1:10:1", fetch=0.0, n=3):
  return Outages(n, S0, failures_lib.parse_failures(spec, n), fetch=fetch)


def test_a_schedule_s_steps_are_spans_at_the_nominal_step_time():
  o = _outages()
  assert o.spans(1, 100.0) == [(2.0, 3.0), (5.0, 5.5)] and o.spans(0, 100.0) == []
  assert [o.down_at(1, t) for t in (1.99, 2.0, 2.99, 3.0, 5.25, 5.5)] == [
      False, True, True, False, True, False]


@pytest.mark.parametrize("start, seconds, want", [
    (0.0, 1.0, (0.0, 1.0, 0.0, 0.0)),       # done before the failure at 2 s
    (1.5, 1.0, (3.0, 4.0, 1.0, 0.5)),       # crash at 2 s: 0.5 s lost, down 2-3, again
    (2.5, 1.0, (3.0, 4.0, 0.5, 0.0)),       # down when it would start: waits to 3 s
    (1.5, 3.8, (5.5, 9.3, 1.5, 2.5)),       # restarted at 3 s, crashed again at 5 s
    (4.0, 1.0, (4.0, 5.0, 0.0, 0.0)),       # ends as the failure starts: not lost
    (4.2, 1.0, (5.5, 6.5, 0.5, 0.8)),
])
def test_a_computation_through_failures(start, seconds, want):
  """Closed forms on worker 1's spans [2, 3) and [5, 5.5): a crash loses the work since the
  computation started and the worker starts it again at the repair."""
  o = _outages()
  begin, finish, down, lost, fetched = o.run(1, start, seconds)
  assert o.split(1, start, finish) == pytest.approx((seconds, down, lost, fetched))
  assert (begin, finish, down, lost) == pytest.approx(want)
  assert fetched == 0.0


def test_a_joiner_fetches_the_model_before_it_computes_again():
  o = _outages(fetch=0.25)
  begin, finish, down, lost, fetched = o.run(1, 1.5, 1.0)
  assert o.split(1, 1.5, finish) == pytest.approx((1.0, down, lost, fetched))
  assert (begin, finish, down, lost, fetched) == pytest.approx((3.25, 4.25, 1.0, 0.5, 0.25))


def test_the_failure_process_s_spans_are_its_failures_in_seconds():
  """At a rate: worker i is down at the middle of its nominal step k exactly when the
  :class:`FailureProcess` (the lockstep clock's) has it down at step k, whichever time is
  asked first (spans drawn as far as asked)."""
  proc = failures_lib.FailureProcess(4, S0, mtbf=0.01, repair=3.0, seed=1)
  late = Outages(4, S0, process=failures_lib.FailureProcess(4, S0, 0.01, 3.0, seed=1))
  late.run(2, 900.0, 1.0)  # far first
  down = np.array([[late.down_at(i, (k + 0.5) * S0) for i in range(4)] for k in range(2000)])
  want = np.array([~proc.alive(k) for k in range(2000)])
  np.testing.assert_array_equal(down, want)
  assert 0.05 < down.mean() < 0.95 and len(late.spans(0, 1000.0)) > 3
