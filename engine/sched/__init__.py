"""The scheduler: tensor-level graphs -> kernels. Its files, in pipeline order:

  multi.py            pass 0: values spread over devices become one value per device (and rules/multi.rules' helpers)
  driver.py           schedule(): the passes in order (each a rule set from rules/, named there)
  fusion.py           pass 2's cost facts: what to realize so no expensive value is computed twice
  stages.py           the chosen nodes wrapped in STAGE, targets given buffers, snapshots of overwritten reads
  kernels.py          pass 6 (each store a Kernel over PARAMs) and the run order
  cache.py            the schedule cache: kernels of a graph shape, reused for every graph of that shape

and the helper libraries rule files `use`, each named after its rules file: early.py (rules/early.rules),
bufferize.py (rules/bufferize.rules), rangeify.py (rules/rangeify.rules), symbolic.py (rules/symbolic.rules).
Running a schedule is one layer up (engine/realize.py).
"""
