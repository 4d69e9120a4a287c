"""SolarRun: the resource's models, validation and planning, and the state machine (torch-free;
shared by the operator and ``solar run``)."""
