"""Independent numpy transcriptions of the reference codes the algorithm tests hold the
framework to: one module per method, each naming its repository, file and commit, importing
nothing from ``nbsgd_jax`` (a reference that re-used our formulas would check nothing)."""
