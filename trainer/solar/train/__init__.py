"""``solar train``: building a run (model, init mode, parallelism, optimizer, EMA, stream), the step
loop, the route objectives, Stage2's three roles, checkpoint I/O and training metrics."""
