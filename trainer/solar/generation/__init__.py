"""One generation path for periodic validation (inside ``solar train``) and ``solar infer``: the
test set and its frozen plan, the solvers and samplers, the passes that write slot directories, and
the videos. It takes a ready model and a weights callback; which checkpoint it came from is the
verb's business."""
