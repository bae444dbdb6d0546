"""The I/O around the decisions: kopf handlers, the controller loop, Kubernetes and Ray clients, metrics."""
