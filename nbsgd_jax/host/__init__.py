"""The host side of a run: its parts (:mod:`nbsgd_jax.host.parts`: failures, communication
draws, periods, the cluster's workload, the simulated clock and totals; consensus targets,
:mod:`nbsgd_jax.host.targets`), the cluster model and its clock (:mod:`~nbsgd_jax.host.
cluster`, :mod:`~nbsgd_jax.host.clock`), communication periods (:mod:`~nbsgd_jax.host.
periods`) and MATCHA's plan (:mod:`~nbsgd_jax.host.matcha`)."""

from nbsgd_jax.host.parts import (Activations, Clock, Failures, Host, HostInputs, HostPart,
                                  Periods, Totals, Workload)
from nbsgd_jax.host.targets import CriticalTarget, Targets, TargetSchedule

__all__ = ["Activations", "Clock", "CriticalTarget", "Failures", "Host", "HostInputs", "HostPart", "Periods",
           "TargetSchedule", "Targets", "Totals", "Workload"]
