"""The host side of a run as parts: failures, communication draws, periods, the cluster's
workload, consensus targets, the simulated clock and totals (:mod:`nbsgd_jax.host.parts`)."""

from nbsgd_jax.host.parts import (Activations, Clock, Failures, Host, HostPart, Periods, Totals,
                                  Workload)
from nbsgd_jax.host.targets import Targets

__all__ = ["Activations", "Clock", "Failures", "Host", "HostPart", "Periods", "Targets",
           "Totals", "Workload"]
