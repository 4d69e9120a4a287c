"""One generation path for periodic validation (inside ``solar train``) and ``solar infer``."""
