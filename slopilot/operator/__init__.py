"""The Kubernetes operator: CRD, reconcile, retune and scale actions."""
