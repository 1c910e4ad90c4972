"""The twin in the loop: the simulator evaluator, the controller's simulator ports, its worker."""
