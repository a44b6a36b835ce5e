"""Studies: the comparison protocol in one file (``docs/guide.md``, "A study in one file").

A study tunes each method on held-out seeds over its grid, reports it over other seeds at the
pick, and compares the methods at equal bytes and equal simulated time::

    python -m nbsgd_jax.study experiments/studies/easgd_vs_dpsgd.py --out runs/easgd --quick

A study is a Python file whose ``get_study()`` returns an ``ml_collections.ConfigDict`` (or a
dict: it keeps the order of methods and variants, which a ConfigDict sorts) with the fields
below. Config overrides are dicts of config keys, either nested by
section (``{"easgd": {"local_steps": 4}}``: a ConfigDict refuses dots in names) or dotted
(``{"easgd.local_steps": 4}``, in a plain dict); tuple values (``cluster.levels``) are allowed.

``base``
  the config every run starts from: overrides of ``default_config()`` (a dict), or the path
  of a config file with ``get_config()`` (relative to the current directory). ``imports``
  (here, in a method's or a variant's overrides) is imported first, so an outside algorithm's
  section (``examples.easgd``) can be set.
``methods``
  ``{name: {"overrides": {...}, "grid": {key: [values]}}}``: each method's config and its
  tuning grid (the product of its axes; at least one key).
``variants``
  ``{name: overrides}`` (default: one variant, ``"default"``, with none): each method is
  reported on each variant at the pick made on ``tune.variant``.
``tune``
  ``seeds`` (an int or a list; never among ``seeds``), ``variant`` (default the first;
  ``"each"``: every variant tuned on its own and reported at its own pick, model sizes),
  ``metric`` (default ``"train_loss"``: its final value is the score, a diverged run never
  wins; with several tuning seeds, their mean), ``mode`` (``"min"`` or ``"max"``) and
  ``extend`` (default True: a pick at the smallest or largest value of a numeric axis adds
  one point beyond it, at the grid's spacing there: geometric for positive values, and
  picks again).
``seeds``
  the reported seeds (``config.seed``).
``budget``
  ``{"num_steps": N}`` or ``{"grads_per_worker": N}`` (``config.budget_unit``).
``columns``
  the table's columns, each a text: ``"final METRIC"``, ``"METRIC at equal X"`` (at the
  largest X every finished reported run of the variant reaches, ``np.interp`` between
  evaluations), ``"X to METRIC <= TARGET"`` (or ``>=``: X when the metric first reaches the
  target; a seed that never does is "not reached", never a number); X is ``sim_time``,
  ``bytes_sent``, ``grads_per_worker`` or ``step``. Default: ``["final METRIC"]``.
``quick``
  what ``--quick`` changes: ``overrides`` (config overrides after the variant's), and
  replacements of ``seeds``, ``budget``, ``tune`` (its fields named).

Each cell is the mean and the sample standard deviation (ddof 1) over the finished seeds; one
seed gives its value and says "1 seed"; diverged and unfinished seeds are named, never
averaged. Runs are cached under ``OUT/runs/<key>/run.json`` (``key``: a hash of the run's
whole config as JSON), so the same command resumes and skips what has run; the runs of one
structure (those differing in hyperparameters and seeds only) share a compiled program
(:func:`nbsgd_jax.run.sweep.train_runs`).

Modules: :mod:`~nbsgd_jax.study.schema` (the fields checked, configs composed),
:mod:`~nbsgd_jax.study.stats` (statistics, pick, extension, equal-x, time to target),
:mod:`~nbsgd_jax.study.runs` (the cache and training), :mod:`~nbsgd_jax.study.driver` (the
protocol), :mod:`~nbsgd_jax.study.output` (``results.json``, ``results.md``, the plots).
"""

from nbsgd_jax.study.driver import run
from nbsgd_jax.study.output import write
from nbsgd_jax.study.schema import Study, check, load_file

__all__ = ["Study", "check", "load_file", "run", "write"]
