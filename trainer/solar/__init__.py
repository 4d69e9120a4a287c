"""Solar: training and inference operations for video world models."""

import time as _time

__version__ = "0.1.0"
# When this process started (the package is the first thing ``python -m solar`` imports): a launch's
# GPU time runs from its first rank's start to its end (solar.launch.session).
STARTED = _time.time()
