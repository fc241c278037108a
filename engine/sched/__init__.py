"""The scheduler: tensor-level graphs -> kernels, and running them. Its files, in pipeline order:

  driver.py           schedule(): the passes in order (each a rule set from rules/, named there)
  fusion.py           pass 2's cost facts: what to realize so no expensive value is computed twice
  stages.py           the chosen nodes wrapped in STAGE, targets given buffers, snapshots of overwritten reads
  kernels.py          pass 6 (each store a Kernel over PARAMs) and the run order
  cache.py            the schedule cache: kernels of a graph shape, reused for every graph of that shape
  realize.py          realize(): schedule (through the cache), then run each kernel on its device

and the helpers that rule files `use`: tensor_helpers.py, indexing.py, symbolic_helpers.py, decomp_helpers.py.
The package imports nothing itself: rule files import its helper modules while the rule library loads.
"""
