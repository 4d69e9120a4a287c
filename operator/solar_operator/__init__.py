"""The SolarRun Kubernetes operator (kopf handlers over ``solar.run``)."""
