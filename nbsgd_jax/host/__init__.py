"""The host side of a run: its parts (:mod:`nbsgd_jax.host.parts`: failures, communication
draws, periods, the cluster's workload, the simulated clock and totals; consensus targets,
:mod:`nbsgd_jax.host.consensus`), the cluster model and its clock (:mod:`~nbsgd_jax.host.
cluster`, :mod:`~nbsgd_jax.host.clock`), communication periods (:mod:`~nbsgd_jax.host.
periods`), MATCHA's plan (:mod:`~nbsgd_jax.topology.matcha`) and the event clock of asynchronous
training (:mod:`~nbsgd_jax.host.event_clock`, its host parts :mod:`~nbsgd_jax.host.events`)."""

from nbsgd_jax.host.event_clock import (Event, EventClock, RandomWalkToken, batch_inputs,
                                        random_peer)
from nbsgd_jax.host.events import EventTimes
from nbsgd_jax.host.parts import (Activations, Clock, Failures, Host, HostInputs, HostPart,
                                  Periods, Totals)
from nbsgd_jax.host.workload import Workload
from nbsgd_jax.host.consensus import CriticalTarget, Targets, TargetSchedule

__all__ = ["Activations", "Clock", "CriticalTarget", "Event", "EventClock", "EventTimes",
           "Failures", "Host", "HostInputs", "HostPart", "Periods", "RandomWalkToken",
           "TargetSchedule", "Targets", "Totals", "Workload", "batch_inputs", "random_peer"]
