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
  wins; with several tuning seeds, their mean), ``mode`` (``"min"`` or ``"max"``),
  ``extend`` (default True: a pick at the smallest or largest value of a numeric axis adds
  one point beyond it, at the grid's spacing there: geometric for positive values, and
  picks again; an integer k >= 0: up to k such steps while the pick stays at an edge, each
  at the spacing of the grid extended so far, every added point in ``results.json``'s
  ``extended``; False: 0) and ``overrides`` (config overrides of the tuning runs only, after
  ``--quick``'s and the budget, before the grid point and the seed; the reported runs do not
  get them: ``{"validation_examples": 1000}`` picks on a split held out of training, the
  test set no part of the choice; ``seed`` and the grid's keys refused; recorded in
  ``results.json``'s ``tune_overrides``. A prefix's runs do not get them).
``seeds``
  the reported seeds (``config.seed``).
``budget``
  ``{"num_steps": N}`` or ``{"grads_per_worker": N}`` (``config.budget_unit``).
``columns``
  the table's columns, each a text: ``"final METRIC"``, ``"METRIC at equal X"`` (at the
  largest X every finished reported run of the variant reaches, ``np.interp`` between
  evaluations), ``"X to METRIC <= TARGET"`` (or ``>=``: X when the metric first reaches the
  target; a seed that never does is "not reached", never a number); X is ``sim_time``,
  ``bytes_sent``, ``grads_per_worker`` or ``step``. Default: ``["final METRIC"]``. Relative
  to a reference METHOD (one of the study's methods, else refused): ``"METRIC gap to
  METHOD"`` (per seed ``100 * (m_seed / ref_seed - 1)``, percent: the final METRIC against
  the reference's final METRIC on the same variant and seed, then mean and std over the seeds
  both finished, a seed without a reference value named; the reference's own cell is 0;
  Charles et al. 2025's "percentage difference in evaluation loss relative to
  data-parallel"), and ``"X to METRIC <= METHOD"`` (or ``>=``; the target is the reference's
  mean final METRIC on the variant, recorded per variant in ``results.json``'s
  ``variants.V.targets``; a reference with no finished run gives "no target", never a
  number). A TARGET written as a number (digits, sign, ".", "e") is a number.
``quick``
  what ``--quick`` changes: ``overrides`` (config overrides after the variant's), and
  replacements of ``seeds``, ``budget``, ``tune`` and ``prefix`` (their fields named).
``claims``
  (optional) ``[{"source": the paper (authors, year, arXiv id, table or equation), "quote":
  its words, "column": one of the columns, "methods": [the study's methods], "supports":
  what our set-up can and cannot support}]``: ``results.md``'s "Claims" section gives per
  claim the source and the quote, the column's values for those methods on each variant
  (mean ± std, seeds) and the supports text (:mod:`~nbsgd_jax.study.claims`).
``trend``
  (optional) ``{"column": one of the columns, "x": a numeric field of each run's summary
  (``model_params``), "log_x": a log x axis (default: when x spans more than a decade)}``:
  ``OUT/trend.png``, per method the column's mean with the std as error bars against the mean
  x over the variant's runs, and ``results.json``'s ``"trend": {method: [[x, mean, std, n]
  per variant]}`` (:mod:`~nbsgd_jax.study.trend`).
``prefix``
  (optional) ``{"overrides": config overrides, "budget": {"num_steps": N}}`` (both required):
  per seed (tuning and reported), one run of the base config, these overrides, ``--quick``'s,
  the budget and the seed, checkpointed at its end and cached in ``OUT/prefix/<key>/``; every
  other run of the seed starts from it (``config.init_from``: its averaged parameters and
  model state, the optimizer and step count fresh), Douillard et al. 2023's protocol (Sec.
  3). A run's ``init_from`` is ``"prefix/<key>"``, relative to OUT, so its cache key names
  the prefix's key, never OUT's path; the variants must keep the model's shapes (one prefix
  per seed). ``quick.prefix`` replaces the fields it names. ``results.json`` gets
  ``"prefix": {seed: {"key", "status", "final", "steps"}}``, ``results.md`` a line
  (:mod:`~nbsgd_jax.study.stages`).

Each cell is the mean and the sample standard deviation (ddof 1) over the finished seeds; one
seed gives its value and says "1 seed"; diverged and unfinished seeds are named, never
averaged. Runs are cached under ``OUT/runs/<key>/run.json`` (``key``: a hash of the run's
whole config as JSON; a run cached before a key was added, or under a key's old name, is found
by the resume rule, :func:`nbsgd_jax.run.records.config_diff`), so the same command resumes
and skips what has run; the runs of one
structure (those differing in hyperparameters and seeds only) share a compiled program
(:func:`nbsgd_jax.run.sweep.train_runs`).

Provenance: each cached run carries the provenance of the code that trained it
(:mod:`nbsgd_jax.core.provenance`); ``results.json`` gets ``"provenance"`` (this process's)
and ``"run_commits"`` (``{commit: number of runs}`` over the runs used, None for a run without
provenance), ``results.md`` a line with both. Training new runs into a cache whose runs were
made by another commit is refused (one line naming the cache, the commits found and the flag)
unless ``--allow_mixed`` (``run(..., allow_mixed=True)``); then, or when the runs used come
from several commits, ``results.json`` says ``"mixed": true`` and ``results.md`` says so.
Reading and rendering a complete cache never needs the flag.

Modules: :mod:`~nbsgd_jax.study.schema` (the fields checked, configs composed),
:mod:`~nbsgd_jax.study.stats` (statistics, pick, extension, equal-x, time to target, gap to a
reference), :mod:`~nbsgd_jax.study.runs` (the cache, its commits and training),
:mod:`~nbsgd_jax.study.stages` (the prefix),
:mod:`~nbsgd_jax.study.driver` (the protocol), :mod:`~nbsgd_jax.study.claims` (claims checked
and rendered), :mod:`~nbsgd_jax.study.trend` (the trend's points and plot),
:mod:`~nbsgd_jax.study.output` (``results.json``, ``results.md``, the plots).
"""

from nbsgd_jax.study.driver import run
from nbsgd_jax.study.output import write
from nbsgd_jax.study.schema import Study, check, load_file

__all__ = ["Study", "check", "load_file", "run", "write"]
